//! Chart tests that need only `helm` (no API server): lint, rendering with the
//! default and the multi-cluster values, the Deployment's safety settings,
//! the config checksum, schema rejections (table-driven), the CRD copy and
//! the RBAC rules against the plain manifests in `rbac/`.

use crate::chart_support;

use std::collections::BTreeSet;

use chart_support::*;
use serde_json::{Value, json};

const MULTI: &str = "ci/multi-cluster-values.yaml";

fn multi_values() -> String {
    chart_dir().join(MULTI).display().to_string()
}

#[test]
fn chart_lint_is_clean_with_default_and_multi_cluster_values() {
    for extra in [vec![], vec!["-f".to_string(), multi_values()]] {
        let mut c = helm();
        c.arg("lint").arg("--strict").arg(chart_dir()).args(&extra);
        let out = run(c);
        let t = text(&out);
        assert!(
            out.status.success(),
            "helm lint --strict {extra:?} failed:\n{t}"
        );
        assert!(t.contains("1 chart(s) linted, 0 chart(s) failed"), "{t}");
        assert!(
            !t.contains("[WARNING]") && !t.contains("[ERROR]"),
            "helm lint {extra:?} not clean:\n{t}"
        );
    }
}

#[test]
fn chart_default_render_has_every_object() {
    let docs = render("kd", "kube-discovery", &[]);
    let got: BTreeSet<String> = kinds(&docs).into_iter().collect();
    let want: BTreeSet<String> = [
        "ServiceAccount/kd-kube-discovery",
        "ConfigMap/kd-kube-discovery",
        "ClusterRole/kd-kube-discovery",
        "ClusterRoleBinding/kd-kube-discovery",
        "Role/kd-kube-discovery-leader-election",
        "RoleBinding/kd-kube-discovery-leader-election",
        "Service/kd-kube-discovery",
        "Deployment/kd-kube-discovery",
        "PodDisruptionBudget/kd-kube-discovery",
        // Defaults added for upgrades and operations: the CRD as a template
        // (crds.enabled), the generated API token, the aggregated view role
        // and the reader role for gateway syncs.
        "CustomResourceDefinition/discoveredservices.kubediscovery.io",
        "Secret/kd-kube-discovery-api-token",
        "ClusterRole/kd-kube-discovery-view",
        "ClusterRole/kd-kube-discovery-reader",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(got, want);
    for d in &docs {
        if ![
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
        ]
        .contains(&d["kind"].as_str().unwrap_or_default())
        {
            assert_eq!(
                d["metadata"]["namespace"], "kube-discovery",
                "{}",
                d["kind"]
            );
        }
    }
    // Optional objects appear when asked for.
    let docs = render(
        "kd",
        "kube-discovery",
        &["--set", "serviceMonitor.enabled=true"],
    );
    let sm = find(&docs, "ServiceMonitor", Some("kd-kube-discovery"));
    assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "http");
    // No PDB for a single replica (it would block node drains).
    let docs = render("kd", "kube-discovery", &["--set", "replicaCount=1"]);
    assert!(
        !kinds(&docs)
            .iter()
            .any(|k| k.starts_with("PodDisruptionBudget/"))
    );
}

#[test]
fn chart_deployment_is_hardened_and_probed() {
    let docs = render("kd", "kube-discovery", &[]);
    let dep = find(&docs, "Deployment", None);
    assert_eq!(dep["spec"]["replicas"], 2);
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "kd-kube-discovery");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = &pod["containers"][0];
    assert_eq!(
        c["image"], "ghcr.io/kube-discovery/kube-discovery:0.1.0",
        "tag defaults to appVersion"
    );
    assert_eq!(
        c["args"],
        json!([
            "run",
            "--config",
            "/etc/kube-discovery/config.yaml",
            "--log-format",
            "json"
        ])
    );
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["ports"][0]["containerPort"], 8080);
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert!(c["resources"]["requests"]["memory"].is_string());
    // The config file is mounted where the args point.
    let mounts = c["volumeMounts"].as_array().expect("volumeMounts");
    assert!(
        mounts
            .iter()
            .any(|m| m["mountPath"] == "/etc/kube-discovery/config.yaml")
    );

    // Scheduling and extras pass through.
    let docs = render(
        "kd",
        "kube-discovery",
        &[
            "--set",
            "nodeSelector.disk=ssd",
            "--set",
            "tolerations[0].key=dedicated,tolerations[0].operator=Exists",
            "--set",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=zone",
            "--set",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
            "--set",
            "extraEnv[0].name=FOO,extraEnv[0].value=bar",
            "--set",
            "extraVolumes[0].name=extra,extraVolumes[0].emptyDir.medium=Memory",
            "--set",
            "extraVolumeMounts[0].name=extra,extraVolumeMounts[0].mountPath=/extra",
            "--set",
            "image.tag=v9,image.pullPolicy=Always",
        ],
    );
    let pod = &find(&docs, "Deployment", None)["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"], json!({"disk": "ssd"}));
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert!(pod["affinity"]["nodeAffinity"].is_object());
    let c = &pod["containers"][0];
    assert_eq!(c["image"], "ghcr.io/kube-discovery/kube-discovery:v9");
    assert_eq!(c["imagePullPolicy"], "Always");
    assert!(
        c["env"]
            .as_array()
            .expect("env")
            .iter()
            .any(|e| e["name"] == "FOO" && e["value"] == "bar")
    );
    assert!(
        pod["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .any(|v| v["name"] == "extra")
    );
    assert!(
        c["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .any(|m| m["mountPath"] == "/extra")
    );
}

fn checksum(args: &[&str]) -> String {
    let docs = render("kd", "kube-discovery", args);
    let dep = find(&docs, "Deployment", None);
    dep["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        .as_str()
        .expect("checksum/config annotation")
        .to_string()
}

#[test]
fn chart_config_checksum_follows_the_config_only() {
    let base = checksum(&[]);
    assert_eq!(base.len(), 64, "sha256 hex: {base}");
    assert_ne!(
        base,
        checksum(&["--set", "controller.drainTerminating=true"]),
        "config change must roll the pods"
    );
    assert_ne!(
        base,
        checksum(&["--set", "discovery.kubernetes.label_selector=app=web"])
    );
    assert_eq!(
        base,
        checksum(&["--set", "podLabels.team=a"]),
        "non-config change must not change the checksum"
    );
}

#[test]
fn chart_renders_single_cluster_config() {
    let docs = render(
        "kd",
        "kube-discovery",
        &[
            "--set",
            "discovery.kubernetes.namespace_selector.not_match[0]=kube-.*",
            "--set",
            "discovery.kubernetes.default_weight=0",
            "--set",
            "discovery.kubernetes.watch_endpoint_slices=false",
            "--set",
            "http.port=9090",
        ],
    );
    let cfg: Value =
        kube_discovery_core::yaml::from_str(&rendered_config(&docs)).expect("config is YAML");
    let k = &cfg["discovery"]["kubernetes"];
    assert!(k.is_object(), "single cluster = object: {k}");
    assert_eq!(k["namespace_selector"], json!({"not_match": ["kube-.*"]}));
    assert_eq!(k["default_weight"], 0, "an explicit 0 weight is kept");
    assert_eq!(k["watch_endpoint_slices"], false);
    assert!(
        k.get("service").is_none() && k.get("client").is_none(),
        "in-cluster defaults: {k}"
    );
    let kd = &cfg["kube_discovery"];
    assert_eq!(kd["http"]["addr"], "0.0.0.0:9090");
    assert_eq!(kd["leader_election"]["enabled"], true);
    assert_eq!(kd["leader_election"]["lease_name"], "kd-kube-discovery");
    assert_eq!(kd["leader_election"]["lease_namespace"], "kube-discovery");
    let dep = find(&docs, "Deployment", None);
    assert_eq!(
        dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"],
        9090
    );
}

#[test]
fn chart_renders_multi_cluster_config_with_secret_credentials() {
    let docs = render("kd", "kube-discovery", &["-f", &multi_values()]);
    let cfg: Value =
        kube_discovery_core::yaml::from_str(&rendered_config(&docs)).expect("config is YAML");
    let list = cfg["discovery"]["kubernetes"]
        .as_array()
        .expect("multi cluster = list");
    let ids: Vec<&str> = list.iter().filter_map(|c| c["id"].as_str()).collect();
    assert_eq!(ids, ["local", "east", "west"]);
    let local = &list[0];
    assert_eq!(local["service"]["host"], "${KUBERNETES_SERVICE_HOST}");
    assert_eq!(
        local["client"]["token_file"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
    let east = &list[1];
    assert_eq!(
        east["client"]["token_file"],
        "/etc/kube-discovery/clusters/east/token"
    );
    assert_eq!(
        east["service"]["ca_file"],
        "/etc/kube-discovery/clusters/east/ca.crt"
    );
    assert_eq!(east["service"]["port"], 6443);
    assert_eq!(east["default_weight"], 10);
    let west = &list[2];
    assert_eq!(
        west["kubeconfig"],
        "/etc/kube-discovery/clusters/west/kubeconfig"
    );
    assert_eq!(west["context"], "west");
    assert!(west.get("service").is_none());

    // The Secrets are mounted exactly where the config points.
    let pod = &find(&docs, "Deployment", None)["spec"]["template"]["spec"];
    let mounts = pod["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts");
    for (id, vol, secret, key, path) in [
        ("east", "cluster-east", "east-reader", "token", "token"),
        ("east", "cluster-east", "east-reader", "ca.crt", "ca.crt"),
        (
            "west",
            "cluster-west",
            "west-kubeconfig",
            "kubeconfig",
            "kubeconfig",
        ),
    ] {
        assert!(
            mounts.iter().any(|m| m["name"] == vol
                && m["mountPath"] == format!("/etc/kube-discovery/clusters/{id}")),
            "mount of {vol}: {mounts:?}"
        );
        let v = pod["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .find(|v| v["name"] == vol)
            .expect(vol);
        let sources = v["projected"]["sources"]
            .as_array()
            .expect("projected sources");
        assert!(
            sources.iter().any(|s| s["secret"]["name"] == secret
                && s["secret"]["items"] == json!([{"key": key, "path": path}])),
            "{vol} projects {secret}/{key} as {path}: {sources:?}"
        );
    }
    // The snapshot sink, when enabled, gets its own Role in its namespace only.
    assert!(!kinds(&docs).iter().any(|k| k.ends_with("-snapshot")));
    let docs = render(
        "kd",
        "kube-discovery",
        &[
            "--set",
            "controller.configMapSnapshot.enabled=true",
            "--set",
            "controller.configMapSnapshot.namespace=gw",
        ],
    );
    let role = find(&docs, "Role", Some("kd-kube-discovery-snapshot"));
    assert_eq!(role["metadata"]["namespace"], "gw");
    let binding = find(&docs, "RoleBinding", Some("kd-kube-discovery-snapshot"));
    assert_eq!(binding["subjects"][0]["namespace"], "kube-discovery");
}

/// Bad values and a piece of the message helm must print for each.
#[test]
fn chart_schema_rejects_bad_values_with_clear_messages() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--set", "replicaCount=two"],
            "/replicaCount': got string, want integer",
        ),
        (
            &["--set", "unknownKey=1"],
            "additional properties 'unknownKey' not allowed",
        ),
        (
            &["--set", "controller.leaderElection.enabeld=true"],
            "additional properties 'enabeld' not allowed",
        ),
        (
            &["--set", "discovery.kubernetes.watch_endpointslices=true"],
            "additional properties 'watch_endpointslices' not allowed",
        ),
        (
            &[
                "--set",
                "discovery.clusters[0].id=Bad_Id,discovery.clusters[0].inCluster=true",
            ],
            "/discovery/clusters/0/id': 'Bad_Id' does not match pattern",
        ),
        (
            &[
                "--set",
                "discovery.clusters[0].id=muchtoolong,discovery.clusters[0].inCluster=true",
            ],
            "/discovery/clusters/0/id': 'muchtoolong' does not match pattern",
        ),
        (
            &["--set", "discovery.clusters[0].inCluster=true"],
            "missing property 'id'",
        ),
        (
            &["--set", "discovery.kubernetes.default_weight=-1"],
            "/discovery/kubernetes/default_weight': minimum",
        ),
        (
            &[
                "--set-string",
                "discovery.kubernetes.watch_endpoint_slices=yes",
            ],
            "/discovery/kubernetes/watch_endpoint_slices': got string, want boolean",
        ),
        (
            &["--set", "discovery.kubernetes.service.schema=ftp"],
            "/discovery/kubernetes/service/schema': value must be one of 'http', 'https'",
        ),
        (
            &["--set", "discovery.kubernetes.service.port=70000"],
            "/discovery/kubernetes/service/port",
        ),
        (
            &["--set", "discovery.kubernetes.client.token=s3cr3t"],
            "/discovery/kubernetes/client/token': 's3cr3t' does not match pattern",
        ),
        (
            &[
                "--set",
                "discovery.kubernetes.namespace_selector.equal=a,discovery.kubernetes.namespace_selector.not_equal=b",
            ],
            "/discovery/kubernetes/namespace_selector': maxProperties",
        ),
        (
            &["--set", "image.pullPolicy=Sometimes"],
            "/image/pullPolicy': value must be one of",
        ),
        (
            &["--set", "controller.logFormat=xml"],
            "/controller/logFormat': value must be one of 'json', 'text'",
        ),
        (
            &["--set", "controller.coalesceWindow=soon"],
            "/controller/coalesceWindow': 'soon' does not match pattern",
        ),
        // Checks the schema cannot express are done by the templates.
        (
            &[
                "--set",
                "discovery.clusters[0].id=a,discovery.clusters[0].inCluster=true,discovery.clusters[1].id=a,discovery.clusters[1].inCluster=true",
            ],
            "discovery.clusters[1].id: duplicate cluster id \"a\"",
        ),
        (
            &[
                "--set",
                "discovery.clusters[0].id=a,discovery.clusters[0].service.host=h",
            ],
            "discovery.clusters[0] (id \"a\"): set one of inCluster, tokenSecret, kubeconfigSecret",
        ),
        (
            &[
                "--set",
                "discovery.clusters[0].id=a,discovery.clusters[0].inCluster=true,discovery.clusters[0].kubeconfigSecret.name=k",
            ],
            "discovery.clusters[0] (id \"a\"): choose one way to connect",
        ),
        (
            &[
                "--set",
                "discovery.clusters[0].id=a,discovery.clusters[0].tokenSecret.name=t",
            ],
            "discovery.clusters[0] (id \"a\"): service.host is required",
        ),
        (
            &[
                "--set",
                "discovery.clusters[0].id=a,discovery.clusters[0].service.host=h,discovery.clusters[0].tokenSecret.name=t,discovery.clusters[0].client.token_file=/t",
            ],
            "discovery.clusters[0] (id \"a\"): tokenSecret and client are exclusive",
        ),
        (
            &[
                "--set",
                "discovery.clusters[0].id=a,discovery.clusters[0].service.host=h,discovery.clusters[0].service.ca_file=/ca,discovery.clusters[0].tokenSecret.name=t,discovery.clusters[0].caSecret.name=c",
            ],
            "discovery.clusters[0] (id \"a\"): caSecret and service.ca_file are exclusive",
        ),
    ];
    let mut failures = Vec::new();
    for (args, want) in cases {
        let out = run(template_cmd("kd", "kube-discovery", args));
        let t = text(&out);
        if out.status.success() {
            failures.push(format!(
                "{args:?}: accepted, expected rejection containing {want:?}"
            ));
        } else if !t.contains(want) {
            failures.push(format!("{args:?}: message lacks {want:?}:\n{t}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // And the good values next to them are accepted (the table is not vacuous).
    for args in [
        &[
            "--set",
            "discovery.clusters[0].id=abc12345,discovery.clusters[0].inCluster=true",
        ][..],
        &[
            "--set",
            "discovery.kubernetes.service.port=${KUBERNETES_SERVICE_PORT}",
        ][..],
        &["--set", "discovery.kubernetes.client.token=${MY_TOKEN}"][..],
        &["--set", "controller.coalesceWindow=250ms"][..],
    ] {
        let out = run(template_cmd("kd", "kube-discovery", args));
        assert!(
            out.status.success(),
            "{args:?} should be accepted:\n{}",
            text(&out)
        );
    }
}

#[test]
fn chart_crd_equals_generated_crd_byte_for_byte() {
    let root = repo_root();
    let generated = std::fs::read(root.join("crds/discoveredservices.yaml"))
        .expect("crds/discoveredservices.yaml");
    let chart =
        std::fs::read(chart_dir().join("files/discoveredservices.yaml")).expect("chart CRD");
    assert!(
        generated == chart,
        "charts/kube-discovery/files/discoveredservices.yaml differs from crds/discoveredservices.yaml: run charts/sync-crds.sh"
    );
    let docs = parse_docs(&String::from_utf8_lossy(&chart));
    assert_eq!(docs.len(), 1);
    assert_eq!(
        docs[0]["metadata"]["name"],
        "discoveredservices.kubediscovery.io"
    );
    // Helm's crds/ folder would install the CRD once and never upgrade it, and
    // a crds/ CRD next to the same CRD in templates/ breaks `helm install`
    // (the template finds an object it does not own): the chart has none.
    assert!(
        std::fs::read_dir(chart_dir().join("crds")).map_or(true, |mut d| d.next().is_none()),
        "charts/kube-discovery/crds/ must not exist: the CRD is templates/crd.yaml (crds.enabled)"
    );

    // The rendered template is the generated CRD plus the chart's labels and
    // the keep policy.
    let rendered = render("kd", "kube-discovery", &[]);
    let crd = find(&rendered, "CustomResourceDefinition", None);
    // (Numbers compared as numbers: the file says `maximum: 65535.0`, Helm's
    // toYaml `65535`; the API server stores both as the same JSON number.)
    assert_eq!(
        numbers_as_f64(&crd["spec"]),
        numbers_as_f64(&docs[0]["spec"]),
        "rendered CRD spec != crds/"
    );
    assert_eq!(crd["metadata"]["name"], docs[0]["metadata"]["name"]);
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    assert_eq!(
        crd["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "Helm"
    );
    let rendered = render("kd", "kube-discovery", &["--set", "crds.keep=false"]);
    let crd = find(&rendered, "CustomResourceDefinition", None);
    assert!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"].is_null(),
        "{crd}"
    );
    let rendered = render("kd", "kube-discovery", &["--set", "crds.enabled=false"]);
    assert!(
        !kinds(&rendered)
            .iter()
            .any(|k| k.starts_with("CustomResourceDefinition/")),
        "crds.enabled=false renders no CRD"
    );
}

/// `v` with every number as an f64 (YAML `65535` and `65535.0` compare equal).
fn numbers_as_f64(v: &Value) -> Value {
    match v {
        Value::Number(n) => json!(n.as_f64()),
        Value::Array(a) => Value::Array(a.iter().map(numbers_as_f64).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), numbers_as_f64(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// RBAC rules normalized for comparison: each rule's lists sorted, rules sorted.
fn rules(obj: &Value) -> Vec<Value> {
    let mut out: Vec<Value> = obj["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| {
            let mut r = r.clone();
            for k in ["apiGroups", "resources", "verbs", "resourceNames"] {
                if let Some(a) = r.get_mut(k).and_then(Value::as_array_mut) {
                    a.sort_by_key(|v| v.to_string());
                }
            }
            r
        })
        .collect();
    out.sort_by_key(|v| v.to_string());
    out
}

fn assert_no_wildcards(what: &str, obj: &Value) {
    for r in obj["rules"].as_array().into_iter().flatten() {
        for k in ["apiGroups", "resources", "verbs", "resourceNames"] {
            for v in r[k].as_array().into_iter().flatten() {
                assert!(
                    v.as_str().is_some_and(|s| !s.contains('*')),
                    "{what}: wildcard in {k}: {r}"
                );
            }
        }
    }
}

#[test]
fn chart_rbac_equals_plain_rbac_manifests() {
    // Release "kube-discovery" in namespace "kube-discovery" gives the names rbac/ uses.
    let chart = render(
        "kube-discovery",
        "kube-discovery",
        &["--set", "controller.configMapSnapshot.enabled=true"],
    );
    let mut plain = Vec::new();
    for f in [
        "rbac/serviceaccount.yaml",
        "rbac/clusterrole.yaml",
        "rbac/role-leader-election.yaml",
        "rbac/optional/configmap-snapshot.yaml",
        "rbac/clusterrole-view.yaml",
        "rbac/clusterrole-reader.yaml",
    ] {
        plain.extend(read_docs(f));
    }
    let mut compared = 0;
    for p in &plain {
        let kind = p["kind"].as_str().expect("kind");
        let name = p["metadata"]["name"].as_str().expect("name");
        let c = find(&chart, kind, Some(name));
        assert_eq!(
            c["metadata"]["namespace"], p["metadata"]["namespace"],
            "{kind}/{name} namespace"
        );
        match kind {
            "ClusterRole" | "Role" => {
                assert_no_wildcards(&format!("rbac/ {kind}/{name}"), p);
                assert_no_wildcards(&format!("chart {kind}/{name}"), c);
                assert_eq!(
                    rules(c),
                    rules(p),
                    "{kind}/{name}: chart rules != rbac/ rules"
                );
                // Aggregation labels (view/edit/admin) are the same too.
                for (k, v) in p["metadata"]["labels"].as_object().into_iter().flatten() {
                    if k.starts_with("rbac.authorization.k8s.io/") {
                        assert_eq!(&c["metadata"]["labels"][k], v, "{kind}/{name} label {k}");
                    }
                }
            }
            "ClusterRoleBinding" | "RoleBinding" => {
                assert_eq!(c["roleRef"], p["roleRef"], "{kind}/{name} roleRef");
                assert_eq!(c["subjects"], p["subjects"], "{kind}/{name} subjects");
            }
            "ServiceAccount" => {}
            other => panic!("unexpected {other} in rbac/"),
        }
        compared += 1;
    }
    assert_eq!(compared, 9, "every plain RBAC object compared");
    // Every RBAC object the chart renders has its plain twin.
    for c in &chart {
        let kind = c["kind"].as_str().unwrap_or_default();
        if ["ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"].contains(&kind) {
            assert!(
                plain
                    .iter()
                    .any(|p| p["kind"] == kind && p["metadata"]["name"] == c["metadata"]["name"]),
                "chart {kind}/{} has no counterpart in rbac/",
                c["metadata"]["name"]
            );
        }
    }
}

#[test]
fn chart_remote_reader_role_is_read_only() {
    let docs = read_docs("rbac/remote/remote-reader.yaml");
    let role = find(&docs, "ClusterRole", Some("kube-discovery-remote-reader"));
    assert_no_wildcards("remote reader", role);
    assert_eq!(
        rules(role),
        rules(&json!({"rules": [
            {"apiGroups": [""], "resources": ["endpoints"], "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            {"apiGroups": [""], "resources": ["services"], "verbs": ["list", "watch"]},
        ]}))
    );
    let binding = find(
        &docs,
        "ClusterRoleBinding",
        Some("kube-discovery-remote-reader"),
    );
    assert_eq!(binding["roleRef"]["name"], "kube-discovery-remote-reader");
    let token = find(&docs, "Secret", Some("kube-discovery-remote-reader"));
    assert_eq!(token["type"], "kubernetes.io/service-account-token");
}

/// Dot paths of every leaf of a YAML mapping (empty maps and lists are leaves).
fn leaf_paths(prefix: &str, v: &Value, out: &mut Vec<String>) {
    match v.as_object() {
        Some(m) if !m.is_empty() => {
            for (k, child) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaf_paths(&p, child, out);
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

#[test]
fn chart_readme_documents_every_value() {
    let values = read_docs("charts/kube-discovery/values.yaml");
    let mut leaves = Vec::new();
    leaf_paths("", &values[0], &mut leaves);
    let readme = std::fs::read_to_string(chart_dir().join("README.md")).expect("chart README");
    // First column of the values table: | `key` | default | meaning |
    let rows: BTreeSet<String> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once("` |").map(|(k, _)| k.to_string()))
        .collect();
    let missing: Vec<&String> = leaves
        .iter()
        .filter(|leaf| {
            !rows
                .iter()
                .any(|r| *leaf == r || leaf.starts_with(&format!("{r}.")))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "values not documented in charts/kube-discovery/README.md: {missing:?}"
    );
    let stale: Vec<&String> = rows
        .iter()
        .filter(|r| {
            !leaves
                .iter()
                .any(|l| l == *r || l.starts_with(&format!("{r}.")))
        })
        .collect();
    assert!(
        stale.is_empty(),
        "README documents values that do not exist: {stale:?}"
    );
    assert!(
        rows.len() >= 60,
        "the values table was found ({} rows)",
        rows.len()
    );
}

fn notes(args: &[&str]) -> String {
    let mut c = helm();
    c.args(["install", "kd"])
        .arg(chart_dir())
        .args(["--namespace", "kube-discovery", "--dry-run=client"])
        .args(args);
    let out = run(c);
    assert!(
        out.status.success(),
        "helm install --dry-run=client {args:?}:\n{}",
        text(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    stdout
        .split_once("NOTES:")
        .map(|(_, n)| n.to_string())
        .unwrap_or_else(|| panic!("no NOTES in:\n{stdout}"))
}

#[test]
fn chart_notes_tell_how_to_see_the_result() {
    let n = notes(&[]);
    for want in [
        "kubectl -n kube-discovery rollout status deployment/kd-kube-discovery",
        "kubectl get discoveredservices -A",
        "kubectl get dsvc -n default kubernetes -o yaml",
        "nodes?service=default/kubernetes:https",
        "kube-discovery nodes default/kubernetes:https",
    ] {
        assert!(n.contains(want), "NOTES lack {want:?}:\n{n}");
    }
    assert!(!n.contains("WARNING"), "{n}");
    let multi = chart_dir().join(MULTI).display().to_string();
    let n = notes(&["-f", &multi]);
    assert!(n.contains("multi-cluster (local, east, west)"), "{n}");
    assert!(
        n.contains("kubectl get dsvc -n kube-discovery local.default.kubernetes -o yaml"),
        "{n}"
    );
    assert!(
        n.contains("kube-discovery nodes local/default/kubernetes:https"),
        "{n}"
    );
    let n = notes(&["--set", "controller.leaderElection.enabled=false"]);
    assert!(n.contains("WARNING: replicaCount is 2"), "{n}");
    // The port-forward target and the curl lines follow the values.
    // By default the API needs the generated token, and NOTES says how to get it.
    let n = notes(&[]);
    for want in [
        "port-forward svc/kd-kube-discovery 8080:8080",
        "bearer token of Secret kube-discovery/kd-kube-discovery-api-token (generated, kept across upgrades)",
        "TOKEN=$(kubectl -n kube-discovery get secret kd-kube-discovery-api-token -o jsonpath='{.data.token}' | base64 -d)",
        "curl -s -H \"Authorization: Bearer $TOKEN\" http://127.0.0.1:8080/v1/discovery/kubernetes/dump",
    ] {
        assert!(n.contains(want), "NOTES lack {want:?}:\n{n}");
    }
    assert!(!n.contains("crds.enabled is false"), "{n}");
    let n = notes(&[
        "--set",
        "http.authTokenSecret.create=false",
        "--set",
        "crds.enabled=false",
    ]);
    assert!(!n.contains("Authorization"), "no token, no header: {n}");
    assert!(
        n.contains("kubectl apply --server-side -f crds/discoveredservices.yaml"),
        "{n}"
    );
    let n = notes(&[
        "--set",
        "service.enabled=false",
        "--set",
        "http.port=9090",
        "--set",
        "http.authTokenSecret.name=kd-api-token",
    ]);
    for want in [
        "port-forward deployment/kd-kube-discovery 9090:9090",
        "get secret kd-api-token -o jsonpath='{.data.token}'",
        "curl -s -H \"Authorization: Bearer $TOKEN\" 'http://127.0.0.1:9090/v1/discovery/kubernetes/nodes?service=default/kubernetes:https'",
        "curl -s -H \"Authorization: Bearer $TOKEN\" http://127.0.0.1:9090/v1/discovery/kubernetes/dump",
    ] {
        assert!(n.contains(want), "NOTES lack {want:?}:\n{n}");
    }
    assert!(!n.contains("svc/kd-kube-discovery"), "{n}");
}
