//! The harness plays kubelet for a few fake Nodes, so the real EndpointSlice
//! controller (in kube-controller-manager) has something to slice: Nodes
//! exist (the controller skips pods on unknown nodes), Pods are created bound
//! to them, and their status (phase, podIP, the Ready condition) is written
//! through the `pods/status` subresource, as a kubelet does. Deleting a Pod
//! with a grace period leaves it terminating until [`FakeKubelet::finish`]
//! removes it, as a kubelet does once the containers stopped.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::{Error, Result};

/// Fake kubelet of a set of Nodes.
pub struct FakeKubelet {
    client: kube::Client,
    nodes: Vec<String>,
}

impl FakeKubelet {
    /// Registers `nodes` (Ready) through `client` (an admin).
    pub async fn register(client: kube::Client, nodes: &[&str]) -> Result<FakeKubelet> {
        let api: Api<Node> = Api::all(client.clone());
        for name in nodes {
            let node: Node = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": "zone-a"}},
            }))
            .map_err(|e| Error::json(format!("Node {name}"), e))?;
            api.create(&PostParams::default(), &node)
                .await
                .map_err(|e| Error::kube(format!("creating Node {name}"), e))?;
            api.patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                    "message": "fake kubelet of kd-testenv"}],
                }})),
            )
            .await
            .map_err(|e| Error::kube(format!("Node {name} status"), e))?;
        }
        Ok(FakeKubelet {
            client,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
        })
    }

    /// The names of the Nodes it registered.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// Creates Pod `ns/name` bound to `node` with `labels` and one container
    /// port `(name, port)`. The namespace's `default` ServiceAccount must
    /// exist (the ServiceAccount admission plugin wants it): the create is
    /// retried for a while until the controller manager has made it.
    pub async fn create_pod(
        &self,
        ns: &str,
        name: &str,
        node: &str,
        labels: &Value,
        port: (&str, i32),
    ) -> Result<()> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                "ports": [{"name": port.0, "containerPort": port.1, "protocol": "TCP"}]}],
            },
        }))
        .map_err(|e| Error::json(format!("Pod {ns}/{name}"), e))?;
        let mut tries = 0;
        loop {
            match api.create(&PostParams::default(), &pod).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.message.contains("serviceaccount") && tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => return Err(Error::kube(format!("creating Pod {ns}/{name}"), e)),
            }
        }
    }

    /// Writes the Pod's status as a kubelet would: Running with `ip`, Ready
    /// (and ContainersReady) `ready`.
    pub async fn set_status(&self, ns: &str, name: &str, ip: &str, ready: bool) -> Result<()> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let flag = if ready { "True" } else { "False" };
        let now = jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Running",
                "hostIP": "10.255.0.1",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "startTime": now,
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
                    {"type": "Ready", "status": flag, "lastTransitionTime": now},
                ],
            }})),
        )
        .await
        .map_err(|e| Error::kube(format!("Pod {ns}/{name} status"), e))?;
        Ok(())
    }

    /// Starts deleting the Pod with its grace period: it stays, terminating
    /// (`deletionTimestamp` set), until [`FakeKubelet::finish`].
    pub async fn terminate(&self, ns: &str, name: &str) -> Result<()> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        api.delete(name, &DeleteParams::default())
            .await
            .map_err(|e| Error::kube(format!("deleting Pod {ns}/{name}"), e))?;
        Ok(())
    }

    /// Removes the Pod for good (grace period 0), as the kubelet does once
    /// its containers stopped.
    pub async fn finish(&self, ns: &str, name: &str) -> Result<()> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        match api
            .delete(name, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(Error::kube(format!("finishing Pod {ns}/{name}"), e)),
        }
    }
}
