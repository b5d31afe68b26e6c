//! What one decoded watch event allocates, and what the decoded object keeps
//! on the heap while it is held: the memory a reflector store (kube-runtime's
//! `reflector`, which keeps every watched object) would need per object, for
//! the lean types the watch decodes now and for the k8s-openapi types it
//! decoded before (issue 19, items 5 and 1). The controller itself keeps no
//! decoded object (the index keeps a reduced contribution per object); this
//! says what keeping them would cost.
//!
//! Counted by `stats_alloc`, a counting wrapper of the system allocator (a
//! separate binary from the criterion `event` bench, so that its timings are
//! not slowed by the counting). The objects are the `event` bench's lines.
//!
//! Run: `cargo bench -p kube-discovery --bench decode_memory` (prints a
//! Markdown table; BENCHMARKS.md has it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::System;

use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube_discovery_core::source::lean::{LeanEndpointSlice, LeanEndpoints};
use serde::de::DeserializeOwned;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[path = "support/lines.rs"]
mod lines;
use lines::{decode, endpoints_line, slice_line};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Per object: allocations while decoding one line, and heap bytes the
/// decoded object keeps (after `prepare`), measured over `n` objects held at
/// once.
fn measure<K: DeserializeOwned + kube::Resource + Clone>(
    line: &str,
    n: usize,
    prepare: fn(&mut K),
) -> (f64, f64) {
    let mut held: Vec<K> = Vec::with_capacity(n);
    let region = Region::new(GLOBAL);
    for _ in 0..n {
        let mut o = decode::<K>(line);
        prepare(&mut o);
        held.push(o);
    }
    let s = region.change();
    // `stats_alloc` adds a growing realloc's difference to
    // `bytes_allocated` (a shrinking one's to `bytes_deallocated`) as well as
    // to `bytes_reallocated`: the live bytes are the first two alone.
    let kept = s.bytes_allocated as f64 - s.bytes_deallocated as f64;
    drop(held);
    (s.allocations as f64 / n as f64, kept / n as f64)
}

fn strip<K: kube::Resource>(o: &mut K) {
    o.managed_fields_mut().clear();
    o.annotations_mut().clear();
}

/// The three rows of one object: k8s-openapi as decoded, stripped, lean;
/// `n` objects held at once.
fn rows<Full, Lean>(object: &str, line: &str, n: usize)
where
    Full: DeserializeOwned + kube::Resource + Clone,
    Lean: DeserializeOwned + kube::Resource + Clone,
{
    let full = std::any::type_name::<Full>().rsplit("::").next().unwrap();
    let lean = std::any::type_name::<Lean>().rsplit("::").next().unwrap();
    for (decoder, (allocs, kept)) in [
        (
            format!("k8s-openapi `{full}`"),
            measure::<Full>(line, n, |_| {}),
        ),
        (
            "k8s-openapi, stripped (managedFields, annotations)".to_string(),
            measure::<Full>(line, n, strip),
        ),
        (
            format!("`{lean}` (the watch now)"),
            measure::<Lean>(line, n, |_| {}),
        ),
    ] {
        println!("| {object} | {decoder} | {allocs:.0} | {kept:.0} |");
    }
}

fn main() {
    let ep = endpoints_line(false);
    let sl = slice_line(3, false);
    println!("| object | decoded as | allocations per decode | heap bytes kept per object |");
    println!("|---|---|---|---|");
    rows::<Endpoints, LeanEndpoints>("`v1/Endpoints`, 1,000 addresses", &ep, 200);
    rows::<EndpointSlice, LeanEndpointSlice>("EndpointSlice, 100 endpoints", &sl, 2000);
    println!(
        "\nline bytes: endpoints_1000 {}, slice_100 {}",
        ep.len(),
        sl.len()
    );
    println!(
        "element sizes: LeanAddress {} B, EndpointAddress {} B, LeanSliceEndpoint {} B, Endpoint {} B",
        size_of::<kube_discovery_core::source::lean::LeanAddress>(),
        size_of::<k8s_openapi::api::core::v1::EndpointAddress>(),
        size_of::<kube_discovery_core::source::lean::LeanSliceEndpoint>(),
        size_of::<k8s_openapi::api::discovery::v1::Endpoint>(),
    );
}
