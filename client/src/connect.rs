//! A kube [`Client`] from a kubeconfig: the one way every reader here (and the
//! controller's `Connection::Kubeconfig`) connects.
//!
//! | `path` | `context` | config |
//! |---|---|---|
//! | `Some(p)` | any | the file `p`, with `context` or its current-context |
//! | `None` | `Some(c)` | the default kubeconfig (`KUBECONFIG`, `~/.kube/config`), context `c` |
//! | `None` | `None` | inferred: the default kubeconfig, else in-cluster |

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::{Error, Result};

/// The kube [`Config`] for a kubeconfig `path` and `context` (table above).
pub async fn kube_config(path: Option<&Path>, context: Option<&str>) -> Result<Config> {
    let opts = KubeConfigOptions {
        context: context.map(str::to_string),
        ..KubeConfigOptions::default()
    };
    match (path, context) {
        (Some(p), _) => {
            let kc = Kubeconfig::read_from(p)?;
            Ok(Config::from_custom_kubeconfig(kc, &opts).await?)
        }
        (None, Some(_)) => Ok(Config::from_kubeconfig(&opts).await?),
        (None, None) => Config::infer().await.map_err(Error::NoConfig),
    }
}

/// A [`Client`] for a kubeconfig `path` and `context` (table above).
pub async fn client(path: Option<&Path>, context: Option<&str>) -> Result<Client> {
    let cfg = kube_config(path, context).await?;
    Ok(Client::try_from(cfg)?)
}
