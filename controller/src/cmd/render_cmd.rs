//! `kube-discovery render`: Kubernetes YAML/JSON in (one object, several
//! documents, or a `List`), the DiscoveredServices the controller would write
//! out. The conversion is the core's `render` (the same Index and conversion
//! code as the controller), configured from the same config file.

use std::io::Read;
use std::path::Path;

use kube_discovery_client::lookup;
use kube_discovery_core::config::parse_config;
use kube_discovery_core::crd::ReaderRule;
use kube_discovery_core::parse_service_name;
use kube_discovery_core::render::{RenderOptions, render_report};
use kube_discovery_core::yaml;
use serde_json::{Value, json};

use crate::cmd::cli::OutputFormat;
use crate::{Error, InputError, Result};

/// Parses every YAML (or JSON) document of `text`.
pub fn parse_documents(text: &str) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for (i, doc) in yaml::manifests(text).into_iter().enumerate() {
        let v = doc.map_err(|source| InputError::Document {
            index: i + 1,
            source,
        })?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

fn read_input(file: &str) -> Result<String> {
    if file == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| Error::Io {
                path: "<stdin>".into(),
                source: e,
            })?;
        Ok(s)
    } else {
        std::fs::read_to_string(file).map_err(|e| Error::Io {
            path: file.to_string(),
            source: e,
        })
    }
}

/// Runs `render` and returns what to print.
pub fn render_command(
    file: &str,
    config: Option<&Path>,
    output: OutputFormat,
    nodes: Option<&str>,
) -> Result<String> {
    let query = nodes
        .map(parse_service_name)
        .transpose()
        .map_err(InputError::NodesFlag)?;
    let opts = match config {
        None => RenderOptions::default(),
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| Error::Io {
                path: p.display().to_string(),
                source: e,
            })?;
            let env = |k: &str| std::env::var(k).ok();
            let cfg = parse_config(&text, &env)?;
            let id = match (&query, cfg.multi_cluster) {
                (Some(q), true) => q.cluster.clone(),
                (None, true) => {
                    let first = cfg
                        .clusters
                        .first()
                        .map(|c| c.id.clone())
                        .unwrap_or_default();
                    tracing::info!(cluster = %first, "multi-cluster config: rendering as cluster {first:?}");
                    first
                }
                (_, false) => String::new(),
            };
            RenderOptions::from_config(&cfg, &id).ok_or(InputError::UnknownCluster(id))?
        }
    };
    let objects = parse_documents(&read_input(file)?)?;
    let rendered = render_report(&objects, &opts).map_err(InputError::Render)?;
    for w in &rendered.warnings {
        tracing::warn!("{w}");
    }
    if let Some(q) = query {
        // The rendered objects are named by the same options (they agree).
        let rule =
            ReaderRule::new(opts.naming.clone()).for_instance(Some(opts.naming.instance.clone()));
        // Rendered at once, a big service's shards always form one version.
        return match lookup(&rendered.objects, &q, &rule).ok().flatten() {
            Some(n) => Ok(format!("{}\n", serde_json::to_string_pretty(&n)?)),
            None => Err(Error::NoNodes {
                query: q.to_string(),
                reason: "the input has no such service and port",
            }),
        };
    }
    match output {
        OutputFormat::Json => {
            let list = json!({"apiVersion": "v1", "kind": "List", "items": rendered.objects});
            Ok(format!("{}\n", serde_json::to_string_pretty(&list)?))
        }
        OutputFormat::Yaml => {
            let docs: Vec<String> = rendered
                .objects
                .iter()
                .map(yaml::to_string)
                .collect::<std::result::Result<_, _>>()?;
            Ok(docs.join("---\n"))
        }
    }
}

#[cfg(test)]
mod tests;
