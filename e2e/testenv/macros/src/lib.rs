//! `#[both_backends]`: writes one async end-to-end test once and runs it on
//! each API server backend of `kd-testenv`.
//!
//! ```ignore
//! #[both_backends]
//! #[tokio::test]
//! async fn scaling(backend: Backend) { /* Env::start(backend) ... */ }
//! ```
//!
//! becomes a module `scaling` with the tests `scaling::kube_sim` and
//! `scaling::real` (every other attribute, `#[tokio::test(..)]` included, is
//! put on both), which call the function with `Backend::Sim` and
//! `Backend::Real`. `./test.sh` selects them by name (`KD_E2E_APISERVER`).

#![warn(missing_docs)]

use proc_macro::TokenStream;
use quote::quote;
use syn::{ItemFn, parse_macro_input};

/// Runs an `async fn name(backend: Backend)` test on each backend: a module
/// `name` with the tests `kube_sim` and `real` (see the crate docs).
#[proc_macro_attribute]
pub fn both_backends(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        return syn::Error::new(
            proc_macro2::Span::call_site(),
            "#[both_backends] takes no arguments",
        )
        .to_compile_error()
        .into();
    }
    let f = parse_macro_input!(item as ItemFn);
    if f.sig.asyncness.is_none() || f.sig.inputs.len() != 1 {
        return syn::Error::new_spanned(
            &f.sig,
            "#[both_backends] wants `async fn name(backend: Backend)`",
        )
        .to_compile_error()
        .into();
    }
    let name = &f.sig.ident;
    let (docs, attrs): (Vec<_>, Vec<_>) = f.attrs.iter().partition(|a| a.path().is_ident("doc"));
    let mut run = f.clone();
    run.attrs.clear();
    run.sig.ident = syn::Ident::new("run", name.span());
    quote! {
        #(#docs)*
        mod #name {
            #[allow(unused_imports)]
            use super::*;

            #run

            #(#attrs)*
            async fn kube_sim() {
                run(::testenv::Backend::Sim).await
            }

            #(#attrs)*
            async fn real() {
                run(::testenv::Backend::Real).await
            }
        }
    }
    .into()
}
