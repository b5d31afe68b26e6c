//! Real helm v4 against kube-sim and the real API server (`#[both_backends]`,
//! TLS): install, upgrade and uninstall a small chart with a CRD, a
//! ServiceAccount, a ClusterRole, a Deployment, a ConfigMap and a custom
//! resource. Helm 4 applies server-side and stores releases in Secrets (label
//! `owner=helm`), so this exercises SSA, selectors and Secrets end to end.
//! (Nothing runs the Deployment: the real server has no controller manager
//! here, as kube-sim has none.)

use crate::sim_support;

use sim_support::{
    Backend, Cli, Cluster, assert_alive, cluster, direct_kubeconfig, options, repo_root,
};
use testenv::both_backends;

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_upgrade_uninstall(backend: Backend) {
    let cl = cluster(backend, options(true)).await;
    tokio::task::block_in_place(|| scenario(&cl));
    assert_alive(&cl);
}

/// The scenario (blocking: run it in `block_in_place`).
fn scenario(cl: &Cluster) {
    let kubeconfig = direct_kubeconfig(cl, &cl.admin_token());
    let helm = Cli::with_kubeconfig(&kubeconfig, "helm");
    let k = Cli::with_kubeconfig(&kubeconfig, "kubectl-1.34");
    let chart = repo_root().join("e2e/tests/testdata/sim-chart");
    let chart = chart.to_str().expect("path");

    let out = helm.ok(&[
        "install",
        "rel1",
        chart,
        "--namespace",
        "apps",
        "--create-namespace",
    ]);
    assert!(out.contains("STATUS: deployed"), "{out}");
    // Everything the chart declares exists.
    assert_eq!(
        k.ok(&["get", "crd", "gadgets.test.kube-sim.io", "-o", "name"])
            .trim(),
        "customresourcedefinition.apiextensions.k8s.io/gadgets.test.kube-sim.io"
    );
    assert_eq!(
        k.ok(&[
            "-n",
            "apps",
            "get",
            "serviceaccount",
            "rel1-sa",
            "-o",
            "name"
        ])
        .trim(),
        "serviceaccount/rel1-sa"
    );
    assert_eq!(
        k.ok(&[
            "get",
            "clusterrole",
            "rel1-reader",
            "-o",
            "jsonpath={.rules[0].resources[0]}"
        ]),
        "configmaps"
    );
    assert_eq!(
        k.ok(&[
            "-n",
            "apps",
            "get",
            "deployment",
            "rel1-app",
            "-o",
            "jsonpath={.spec.template.spec.serviceAccountName}"
        ]),
        "rel1-sa"
    );
    assert_eq!(
        k.ok(&[
            "-n",
            "apps",
            "get",
            "configmap",
            "rel1-config",
            "-o",
            "jsonpath={.data.greeting}"
        ]),
        "hello"
    );
    assert_eq!(
        k.ok(&[
            "-n",
            "apps",
            "get",
            "gadget",
            "rel1-gadget",
            "-o",
            "jsonpath={.spec.size}"
        ]),
        "2"
    );
    // The release is stored in a Secret labelled owner=helm.
    let secrets = k.ok(&[
        "-n",
        "apps",
        "get",
        "secrets",
        "-l",
        "owner=helm,name=rel1",
        "-o",
        "name",
    ]);
    assert_eq!(secrets.trim(), "secret/sh.helm.release.v1.rel1.v1");

    let out = helm.ok(&[
        "upgrade",
        "rel1",
        chart,
        "--namespace",
        "apps",
        "--set",
        "greeting=bye",
        "--set",
        "replicas=3",
    ]);
    assert!(out.contains("REVISION: 2"), "{out}");
    assert_eq!(
        k.ok(&[
            "-n",
            "apps",
            "get",
            "configmap",
            "rel1-config",
            "-o",
            "jsonpath={.data.greeting}"
        ]),
        "bye"
    );
    let dep = k.json(&["-n", "apps", "get", "deployment", "rel1-app", "-o", "json"]);
    assert_eq!(dep["spec"]["replicas"], 3);
    assert_eq!(
        dep["metadata"]["generation"], 2,
        "spec change bumps generation"
    );
    let list = helm.ok(&["list", "--namespace", "apps", "-o", "json"]);
    let list: serde_json::Value = serde_json::from_str(&list).expect("helm list json");
    assert_eq!(list[0]["revision"], "2");
    assert_eq!(list[0]["status"], "deployed");

    // Helm applied server-side: its field manager owns the ConfigMap's data.
    let cm = k.json(&[
        "-n",
        "apps",
        "get",
        "configmap",
        "rel1-config",
        "-o",
        "json",
        "--show-managed-fields",
    ]);
    let managers: Vec<&str> = cm["metadata"]["managedFields"]
        .as_array()
        .map(|a| a.iter().filter_map(|m| m["manager"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        managers.iter().any(|m| m.contains("helm")),
        "managers: {managers:?}"
    );

    let out = helm.ok(&["uninstall", "rel1", "--namespace", "apps"]);
    assert!(out.contains("release \"rel1\" uninstalled"), "{out}");
    for (kind, name) in [
        ("configmap", "rel1-config"),
        ("deployment", "rel1-app"),
        ("serviceaccount", "rel1-sa"),
        ("gadget", "rel1-gadget"),
    ] {
        let err = k.fails(&["-n", "apps", "get", kind, name]);
        assert!(
            err.contains("NotFound"),
            "{kind}/{name} still present: {err}"
        );
    }
    assert!(
        k.fails(&["get", "clusterrole", "rel1-reader"])
            .contains("NotFound")
    );
    assert_eq!(
        k.ok(&[
            "-n",
            "apps",
            "get",
            "secrets",
            "-l",
            "owner=helm",
            "-o",
            "name"
        ])
        .trim(),
        ""
    );
    // Helm keeps CRDs on uninstall.
    k.ok(&["get", "crd", "gadgets.test.kube-sim.io"]);
}
