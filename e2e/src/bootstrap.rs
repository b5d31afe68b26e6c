//! Objects every cluster has before its first request: the usual namespaces
//! and the RBAC roles the real server bootstraps (discovery, public info,
//! basic user, cluster-admin), committed as ordinary writes at the first
//! revisions.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::state::SimState;
use crate::store::EventType;

/// Objects every cluster has: the usual namespaces and the discovery ClusterRoles
/// that let any authenticated user read discovery, OpenAPI and /version.
pub(crate) fn bootstrap(shared: &SimState) {
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let mut objs: Vec<(&str, Value)> = Vec::new();
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        objs.push(("/namespaces", json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}, "spec": {}, "status": {"phase": "Active"}})));
    }
    objs.push((
        "rbac.authorization.k8s.io/clusterroles",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:discovery"},
               "rules": [{"verbs": ["get"], "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/readyz", "/openapi", "/openapi/*", "/version", "/version/"]}]}),
    ));
    objs.push((
        "rbac.authorization.k8s.io/clusterrolebindings",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "system:discovery"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:discovery"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}]}),
    ));
    objs.push((
        "rbac.authorization.k8s.io/clusterroles",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:public-info-viewer"},
               "rules": [{"verbs": ["get"], "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"]}]}),
    ));
    objs.push((
        "rbac.authorization.k8s.io/clusterrolebindings",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "system:public-info-viewer"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:public-info-viewer"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"},
                            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:unauthenticated"}]}),
    ));
    objs.push((
        "rbac.authorization.k8s.io/clusterroles",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:basic-user"},
               "rules": [{"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews"], "verbs": ["create"]}]}),
    ));
    objs.push((
        "rbac.authorization.k8s.io/clusterrolebindings",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "system:basic-user"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:basic-user"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}]}),
    ));
    objs.push((
        "rbac.authorization.k8s.io/clusterroles",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "cluster-admin"},
               "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}]}),
    ));
    objs.push((
        "rbac.authorization.k8s.io/clusterrolebindings",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "cluster-admin"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:masters"}]}),
    ));
    let mut st = shared.store.lock().unwrap_or_else(|p| p.into_inner());
    for (res, mut obj) in objs {
        let rv = st.next_rv();
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        obj["metadata"]["uid"] = json!(uuid::Uuid::new_v4().to_string());
        obj["metadata"]["creationTimestamp"] = json!(now);
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        st.commit(
            rv,
            EventType::Added,
            (res.to_string(), String::new(), name),
            None,
            Arc::new(obj),
        );
    }
    let rv = st.rv;
    drop(st);
    shared.rv_tx.send_replace(rv);
}
