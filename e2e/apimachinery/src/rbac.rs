//! RBAC authorization over stored objects, mirroring
//! `plugin/pkg/auth/authorizer/rbac` of the Kubernetes API server.
//!
//! [`authorize`] visits, like the real authorizer, first every
//! ClusterRoleBinding (cluster-wide rules), then — for namespaced requests only —
//! the RoleBindings of the request's namespace, whose `roleRef` may name a Role of
//! that namespace or a ClusterRole (whose rules then apply in that namespace
//! only). A request is allowed as soon as one rule of one bound role allows it.
//!
//! Rule matching ([`rule_allows`]):
//! * verbs: exact or `*`;
//! * apiGroups: exact or `*` (the core group is `""`);
//! * resources: `*`, exact `resource` or `resource/subresource`, or `*/subresource`;
//! * resourceNames: an empty list allows any name; otherwise only requests that
//!   carry one of the names (a `list`/`create` without a name never matches);
//! * nonResourceURLs (only non-resource requests): exact, `*`, or a `prefix*`.
//!
//! Subjects: `User` by name, `Group` by membership, `ServiceAccount` by the
//! username `system:serviceaccount:<ns>:<name>`; a ServiceAccount subject without
//! `namespace` in a RoleBinding defaults to the binding's namespace (as the real
//! authorizer does) and never matches in a ClusterRoleBinding.
//!
//! Two things the real API server does outside the RBAC authorizer are folded in:
//! members of `system:masters` are always allowed (the privileged-group
//! authorizer), and `aggregationRule` is evaluated on the fly — a ClusterRole's
//! effective rules are its own plus those of every ClusterRole whose labels match
//! one of its `clusterRoleSelectors` (one level; the real aggregation controller
//! writes the same union into `.rules`). Bootstrap roles (`cluster-admin`,
//! `system:discovery`, ...) exist only if the caller stores them.

use serde_json::Value;

use crate::selector::{LabelSelector, LabelSelectorExt};

/// The authenticated user making a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// e.g. `system:serviceaccount:kd:ctl` or `admin`
    pub name: String,
    /// e.g. `["system:serviceaccounts", "system:serviceaccounts:kd", "system:authenticated"]`
    pub groups: Vec<String>,
}

impl UserInfo {
    /// The user a ServiceAccount token authenticates as, with the groups the
    /// API server adds.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        UserInfo {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".to_string(),
            ],
        }
    }
}

/// What is being requested (`authorizer.Attributes`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestAttributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`, ...
    pub verb: String,
    /// `""` for the core group.
    pub api_group: String,
    /// Plural resource name, e.g. `endpoints`.
    pub resource: String,
    /// e.g. `status`; empty for the main resource.
    pub subresource: String,
    /// Empty for cluster-scoped requests.
    pub namespace: String,
    /// Empty for collection requests.
    pub name: String,
    /// `false` for non-resource URLs such as `/healthz`.
    pub resource_request: bool,
    /// The request path (used for non-resource requests).
    pub path: String,
}

/// The group whose members bypass RBAC.
pub const PRIVILEGED_GROUP: &str = "system:masters";

fn str_list(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn str_at<'v>(v: &'v Value, ptr: &str) -> &'v str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

/// Whether one PolicyRule (as JSON) allows the request.
pub fn rule_allows(rule: &Value, attrs: &RequestAttributes) -> bool {
    let verbs = str_list(rule, "verbs");
    if !verbs.iter().any(|v| v == "*" || *v == attrs.verb) {
        return false;
    }
    if !attrs.resource_request {
        return str_list(rule, "nonResourceURLs").iter().any(|u| {
            u == "*"
                || *u == attrs.path
                || u.strip_suffix('*')
                    .is_some_and(|prefix| attrs.path.starts_with(prefix))
        });
    }
    let groups = str_list(rule, "apiGroups");
    if !groups.iter().any(|g| g == "*" || *g == attrs.api_group) {
        return false;
    }
    let combined = if attrs.subresource.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    let resources = str_list(rule, "resources");
    let resource_ok = resources.iter().any(|r| {
        r == "*"
            || *r == combined
            || (!attrs.subresource.is_empty()
                && r.strip_prefix("*/") == Some(attrs.subresource.as_str()))
    });
    if !resource_ok {
        return false;
    }
    let names = str_list(rule, "resourceNames");
    names.is_empty() || names.contains(&attrs.name)
}

fn subject_matches(subject: &Value, user: &UserInfo, binding_namespace: &str) -> bool {
    let name = str_at(subject, "/name");
    match str_at(subject, "/kind") {
        "User" => !name.is_empty() && name == user.name,
        "Group" => user.groups.iter().any(|g| g == name),
        "ServiceAccount" => {
            let ns = match str_at(subject, "/namespace") {
                "" => binding_namespace,
                ns => ns,
            };
            !ns.is_empty()
                && !name.is_empty()
                && user.name == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn binding_applies(binding: &Value, user: &UserInfo, binding_namespace: &str) -> bool {
    binding
        .get("subjects")
        .and_then(Value::as_array)
        .is_some_and(|subjects| {
            subjects
                .iter()
                .any(|s| subject_matches(s, user, binding_namespace))
        })
}

fn name_of(v: &Value) -> &str {
    str_at(v, "/metadata/name")
}

fn namespace_of(v: &Value) -> &str {
    str_at(v, "/metadata/namespace")
}

fn rules_of(role: &Value) -> Vec<&Value> {
    role.get("rules")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

/// The effective rules of a ClusterRole, including aggregated ones.
fn cluster_role_rules<'v>(role: &'v Value, cluster_roles: &'v [Value]) -> Vec<&'v Value> {
    let mut rules = rules_of(role);
    let selectors = role
        .pointer("/aggregationRule/clusterRoleSelectors")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| LabelSelector::from_label_selector_value(s).ok())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    if selectors.is_empty() {
        return rules;
    }
    for other in cluster_roles {
        if name_of(other) == name_of(role) {
            continue;
        }
        let labels = other.pointer("/metadata/labels");
        if selectors
            .iter()
            .any(|s| !s.is_empty() && s.matches_value(labels))
        {
            rules.extend(rules_of(other));
        }
    }
    rules
}

/// Decides whether `user` may perform `attrs`, given every stored Role,
/// ClusterRole, RoleBinding and ClusterRoleBinding (as JSON objects).
pub fn authorize(
    user: &UserInfo,
    attrs: &RequestAttributes,
    roles: &[Value],
    cluster_roles: &[Value],
    role_bindings: &[Value],
    cluster_role_bindings: &[Value],
) -> bool {
    if user.groups.iter().any(|g| g == PRIVILEGED_GROUP) {
        return true;
    }
    let find_cluster_role = |name: &str| cluster_roles.iter().find(|r| name_of(r) == name);
    for crb in cluster_role_bindings {
        if str_at(crb, "/roleRef/kind") != "ClusterRole" || !binding_applies(crb, user, "") {
            continue;
        }
        if let Some(role) = find_cluster_role(str_at(crb, "/roleRef/name"))
            && cluster_role_rules(role, cluster_roles)
                .iter()
                .any(|r| rule_allows(r, attrs))
        {
            return true;
        }
    }
    if attrs.namespace.is_empty() {
        return false;
    }
    for rb in role_bindings
        .iter()
        .filter(|rb| namespace_of(rb) == attrs.namespace)
    {
        if !binding_applies(rb, user, &attrs.namespace) {
            continue;
        }
        let role_name = str_at(rb, "/roleRef/name");
        let rules = match str_at(rb, "/roleRef/kind") {
            "Role" => roles
                .iter()
                .find(|r| name_of(r) == role_name && namespace_of(r) == attrs.namespace)
                .map(rules_of)
                .unwrap_or_default(),
            "ClusterRole" => find_cluster_role(role_name)
                .map(|r| cluster_role_rules(r, cluster_roles))
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        if rules.iter().any(|r| rule_allows(r, attrs)) {
            return true;
        }
    }
    false
}

/// The authorizer's reason text, e.g.
/// `User "u" cannot list resource "endpoints" in API group "" in the namespace "default"`.
pub fn forbidden_reason(user: &UserInfo, attrs: &RequestAttributes) -> String {
    if !attrs.resource_request {
        return format!(
            "User {:?} cannot {} path {:?}",
            user.name, attrs.verb, attrs.path
        );
    }
    let mut resource = attrs.resource.clone();
    if !attrs.subresource.is_empty() {
        resource = format!("{resource}/{}", attrs.subresource);
    }
    if attrs.namespace.is_empty() {
        format!(
            "User {:?} cannot {} resource {:?} in API group {:?} at the cluster scope",
            user.name, attrs.verb, resource, attrs.api_group
        )
    } else {
        format!(
            "User {:?} cannot {} resource {:?} in API group {:?} in the namespace {:?}",
            user.name, attrs.verb, resource, attrs.api_group, attrs.namespace
        )
    }
}

fn qualified_resource(attrs: &RequestAttributes) -> String {
    if attrs.api_group.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}.{}", attrs.resource, attrs.api_group)
    }
}

/// The full `Status.message` of the 403, exactly as the API server writes it:
/// `endpoints is forbidden: User ...`, `endpoints "x" is forbidden: User ...`,
/// `discoveredservices.kubediscovery.io "x" is forbidden: ...` or
/// `forbidden: User "u" cannot get path "/foo"`.
pub fn forbidden_message(user: &UserInfo, attrs: &RequestAttributes) -> String {
    let reason = forbidden_reason(user, attrs);
    if !attrs.resource_request || attrs.resource.is_empty() {
        return format!("forbidden: {reason}");
    }
    let gr = qualified_resource(attrs);
    if attrs.name.is_empty() {
        format!("{gr} is forbidden: {reason}")
    } else {
        format!("{gr} {:?} is forbidden: {reason}", attrs.name)
    }
}

/// The complete 403 `Status` object the API server returns.
pub fn forbidden_status(user: &UserInfo, attrs: &RequestAttributes) -> Value {
    let mut details = serde_json::Map::new();
    if attrs.resource_request {
        if !attrs.name.is_empty() {
            details.insert("name".into(), Value::String(attrs.name.clone()));
        }
        if !attrs.api_group.is_empty() {
            details.insert("group".into(), Value::String(attrs.api_group.clone()));
        }
        details.insert("kind".into(), Value::String(attrs.resource.clone()));
    }
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": forbidden_message(user, attrs),
        "reason": "Forbidden",
        "details": details,
        "code": 403
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sa() -> UserInfo {
        UserInfo::service_account("kd", "ctl")
    }

    fn req(
        verb: &str,
        group: &str,
        resource: &str,
        sub: &str,
        ns: &str,
        name: &str,
    ) -> RequestAttributes {
        RequestAttributes {
            verb: verb.into(),
            api_group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
            resource_request: true,
            path: String::new(),
        }
    }

    fn path_req(verb: &str, path: &str) -> RequestAttributes {
        RequestAttributes {
            verb: verb.into(),
            path: path.into(),
            resource_request: false,
            ..Default::default()
        }
    }

    fn cluster_role(name: &str, rules: Value) -> Value {
        json!({"kind": "ClusterRole", "metadata": {"name": name}, "rules": rules})
    }

    fn role(ns: &str, name: &str, rules: Value) -> Value {
        json!({"kind": "Role", "metadata": {"name": name, "namespace": ns}, "rules": rules})
    }

    fn crb(name: &str, role: &str, subjects: Value) -> Value {
        json!({"kind": "ClusterRoleBinding", "metadata": {"name": name},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
               "subjects": subjects})
    }

    fn rb(ns: &str, name: &str, kind: &str, role: &str, subjects: Value) -> Value {
        json!({"kind": "RoleBinding", "metadata": {"name": name, "namespace": ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
               "subjects": subjects})
    }

    fn sa_subject() -> Value {
        json!([{"kind": "ServiceAccount", "name": "ctl", "namespace": "kd"}])
    }

    #[test]
    fn cluster_role_binding_grants_everywhere() {
        let crs = [cluster_role(
            "reader",
            json!([{"apiGroups": [""], "resources": ["endpoints"], "verbs": ["get", "list", "watch"]}]),
        )];
        let crbs = [crb("b", "reader", sa_subject())];
        assert!(authorize(
            &sa(),
            &req("list", "", "endpoints", "", "default", ""),
            &[],
            &crs,
            &[],
            &crbs
        ));
        assert!(authorize(
            &sa(),
            &req("list", "", "endpoints", "", "", ""),
            &[],
            &crs,
            &[],
            &crbs
        ));
        assert!(!authorize(
            &sa(),
            &req("delete", "", "endpoints", "", "default", "x"),
            &[],
            &crs,
            &[],
            &crbs
        ));
        assert!(!authorize(
            &sa(),
            &req("list", "", "services", "", "default", ""),
            &[],
            &crs,
            &[],
            &crbs
        ));
        assert!(!authorize(
            &sa(),
            &req("list", "apps", "endpoints", "", "default", ""),
            &[],
            &crs,
            &[],
            &crbs
        ));
        assert!(!authorize(
            &sa(),
            &req("list", "", "endpoints", "", "default", ""),
            &[],
            &crs,
            &[],
            &[]
        ));
    }

    #[test]
    fn role_binding_scopes_to_its_namespace() {
        let roles = [role(
            "kd",
            "r",
            json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]),
        )];
        let rbs = [rb("kd", "b", "Role", "r", sa_subject())];
        assert!(authorize(
            &sa(),
            &req("update", "", "configmaps", "", "kd", "cm"),
            &roles,
            &[],
            &rbs,
            &[]
        ));
        assert!(!authorize(
            &sa(),
            &req("update", "", "configmaps", "", "other", "cm"),
            &roles,
            &[],
            &rbs,
            &[]
        ));
        assert!(
            !authorize(
                &sa(),
                &req("list", "", "configmaps", "", "", ""),
                &roles,
                &[],
                &rbs,
                &[]
            ),
            "cluster scope"
        );
        // A Role of the same name in another namespace does not count.
        let roles_elsewhere = [role(
            "other",
            "r",
            json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]),
        )];
        assert!(!authorize(
            &sa(),
            &req("get", "", "configmaps", "", "kd", "cm"),
            &roles_elsewhere,
            &[],
            &rbs,
            &[]
        ));
    }

    #[test]
    fn role_binding_to_cluster_role_is_namespaced() {
        let crs = [cluster_role(
            "edit",
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
        )];
        let rbs = [rb("kd", "b", "ClusterRole", "edit", sa_subject())];
        assert!(authorize(
            &sa(),
            &req("delete", "apps", "deployments", "", "kd", "d"),
            &[],
            &crs,
            &rbs,
            &[]
        ));
        assert!(!authorize(
            &sa(),
            &req("delete", "apps", "deployments", "", "default", "d"),
            &[],
            &crs,
            &rbs,
            &[]
        ));
        assert!(!authorize(
            &sa(),
            &req("list", "", "namespaces", "", "", ""),
            &[],
            &crs,
            &rbs,
            &[]
        ));
    }

    #[test]
    fn subresources() {
        let crs = [cluster_role(
            "status",
            json!([
                {"apiGroups": ["kubediscovery.io"], "resources": ["discoveredservices/status"], "verbs": ["patch"]},
                {"apiGroups": [""], "resources": ["*/scale"], "verbs": ["get"]}
            ]),
        )];
        let crbs = [crb("b", "status", sa_subject())];
        let a = |v: &str, g: &str, r: &str, s: &str| {
            authorize(&sa(), &req(v, g, r, s, "kd", "x"), &[], &crs, &[], &crbs)
        };
        assert!(a(
            "patch",
            "kubediscovery.io",
            "discoveredservices",
            "status"
        ));
        assert!(
            !a("patch", "kubediscovery.io", "discoveredservices", ""),
            "main resource not granted"
        );
        assert!(a("get", "", "replicationcontrollers", "scale"));
        assert!(!a("get", "", "replicationcontrollers", ""));
        // `*` covers subresources, a plain resource does not.
        let all = [cluster_role(
            "all",
            json!([{"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}]),
        )];
        let plain = [cluster_role(
            "all",
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
        )];
        let crbs = [crb("b", "all", sa_subject())];
        assert!(authorize(
            &sa(),
            &req("get", "", "pods", "log", "kd", "p"),
            &[],
            &all,
            &[],
            &crbs
        ));
        assert!(!authorize(
            &sa(),
            &req("get", "", "pods", "log", "kd", "p"),
            &[],
            &plain,
            &[],
            &crbs
        ));
    }

    #[test]
    fn resource_names_only_match_named_requests() {
        let crs = [cluster_role(
            "one",
            json!([{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cfg"], "verbs": ["get", "list", "update"]}]),
        )];
        let crbs = [crb("b", "one", sa_subject())];
        assert!(authorize(
            &sa(),
            &req("get", "", "configmaps", "", "kd", "cfg"),
            &[],
            &crs,
            &[],
            &crbs
        ));
        assert!(!authorize(
            &sa(),
            &req("get", "", "configmaps", "", "kd", "other"),
            &[],
            &crs,
            &[],
            &crbs
        ));
        assert!(!authorize(
            &sa(),
            &req("list", "", "configmaps", "", "kd", ""),
            &[],
            &crs,
            &[],
            &crbs
        ));
    }

    #[test]
    fn non_resource_urls() {
        let crs = [cluster_role(
            "nr",
            json!([{"nonResourceURLs": ["/healthz", "/apis/*"], "verbs": ["get"]}]),
        )];
        let crbs = [crb(
            "b",
            "nr",
            json!([{"kind": "Group", "name": "system:authenticated"}]),
        )];
        let ok = |p: &str| authorize(&sa(), &path_req("get", p), &[], &crs, &[], &crbs);
        assert!(ok("/healthz"));
        assert!(!ok("/healthz/ready"));
        assert!(ok("/apis/"));
        assert!(ok("/apis/apps/v1"));
        assert!(!ok("/api"));
        assert!(!authorize(
            &sa(),
            &path_req("post", "/healthz"),
            &[],
            &crs,
            &[],
            &crbs
        ));
        // Non-resource rules never grant resource requests and vice versa.
        assert!(!authorize(
            &sa(),
            &req("get", "", "healthz", "", "", ""),
            &[],
            &crs,
            &[],
            &crbs
        ));
        // Non-resource rules bound by a RoleBinding do not apply.
        let rbs = [rb("kd", "b", "ClusterRole", "nr", sa_subject())];
        assert!(!authorize(
            &sa(),
            &path_req("get", "/healthz"),
            &[],
            &crs,
            &rbs,
            &[]
        ));
    }

    #[test]
    fn subjects_user_group_and_service_account() {
        let crs = [cluster_role(
            "r",
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
        )];
        let r = req("get", "", "pods", "", "kd", "p");
        let alice = UserInfo {
            name: "alice".into(),
            groups: vec!["devs".into()],
        };
        let user_binding = [crb(
            "b",
            "r",
            json!([{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}]),
        )];
        assert!(authorize(&alice, &r, &[], &crs, &[], &user_binding));
        assert!(!authorize(&sa(), &r, &[], &crs, &[], &user_binding));
        let group_binding = [crb("b", "r", json!([{"kind": "Group", "name": "devs"}]))];
        assert!(authorize(&alice, &r, &[], &crs, &[], &group_binding));
        let sa_group = [crb(
            "b",
            "r",
            json!([{"kind": "Group", "name": "system:serviceaccounts:kd"}]),
        )];
        assert!(authorize(&sa(), &r, &[], &crs, &[], &sa_group));
        assert!(!authorize(&alice, &r, &[], &crs, &[], &sa_group));
        // ServiceAccount without namespace: never in a ClusterRoleBinding ...
        let no_ns = json!([{"kind": "ServiceAccount", "name": "ctl"}]);
        assert!(!authorize(
            &sa(),
            &r,
            &[],
            &crs,
            &[],
            &[crb("b", "r", no_ns.clone())]
        ));
        // ... but defaults to the RoleBinding's namespace.
        assert!(authorize(
            &sa(),
            &r,
            &[],
            &crs,
            &[rb("kd", "b", "ClusterRole", "r", no_ns.clone())],
            &[]
        ));
        assert!(!authorize(
            &UserInfo::service_account("other", "ctl"),
            &req("get", "", "pods", "", "other", "p"),
            &[],
            &crs,
            &[rb("kd", "b", "ClusterRole", "r", no_ns)],
            &[]
        ));
        // Wrong namespace in the subject.
        let wrong = [crb(
            "b",
            "r",
            json!([{"kind": "ServiceAccount", "name": "ctl", "namespace": "x"}]),
        )];
        assert!(!authorize(&sa(), &r, &[], &crs, &[], &wrong));
    }

    #[test]
    fn missing_role_and_masters() {
        let crbs = [crb("b", "absent", sa_subject())];
        assert!(!authorize(
            &sa(),
            &req("get", "", "pods", "", "kd", "p"),
            &[],
            &[],
            &[],
            &crbs
        ));
        let admin = UserInfo {
            name: "admin".into(),
            groups: vec![PRIVILEGED_GROUP.into()],
        };
        assert!(authorize(
            &admin,
            &req("delete", "", "namespaces", "", "", "kd"),
            &[],
            &[],
            &[],
            &[]
        ));
    }

    #[test]
    fn aggregation_rule() {
        let crs = [
            json!({"kind": "ClusterRole", "metadata": {"name": "agg"},
                   "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"agg": "true"}}]}, "rules": []}),
            json!({"kind": "ClusterRole", "metadata": {"name": "part", "labels": {"agg": "true"}},
                   "rules": [{"apiGroups": [""], "resources": ["services"], "verbs": ["list"]}]}),
            json!({"kind": "ClusterRole", "metadata": {"name": "unlabelled"},
                   "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}]}),
        ];
        let crbs = [crb("b", "agg", sa_subject())];
        assert!(authorize(
            &sa(),
            &req("list", "", "services", "", "kd", ""),
            &[],
            &crs,
            &[],
            &crbs
        ));
        assert!(!authorize(
            &sa(),
            &req("list", "", "secrets", "", "kd", ""),
            &[],
            &crs,
            &[],
            &crbs
        ));
    }

    #[test]
    fn forbidden_messages_match_the_api_server() {
        let u = sa();
        assert_eq!(
            forbidden_message(&u, &req("list", "", "endpoints", "", "default", "")),
            r#"endpoints is forbidden: User "system:serviceaccount:kd:ctl" cannot list resource "endpoints" in API group "" in the namespace "default""#
        );
        assert_eq!(
            forbidden_message(&u, &req("list", "", "namespaces", "", "", "")),
            r#"namespaces is forbidden: User "system:serviceaccount:kd:ctl" cannot list resource "namespaces" in API group "" at the cluster scope"#
        );
        assert_eq!(
            forbidden_message(
                &u,
                &req(
                    "patch",
                    "kubediscovery.io",
                    "discoveredservices",
                    "status",
                    "kd",
                    "web"
                )
            ),
            r#"discoveredservices.kubediscovery.io "web" is forbidden: User "system:serviceaccount:kd:ctl" cannot patch resource "discoveredservices/status" in API group "kubediscovery.io" in the namespace "kd""#
        );
        assert_eq!(
            forbidden_message(&u, &path_req("get", "/foo")),
            r#"forbidden: User "system:serviceaccount:kd:ctl" cannot get path "/foo""#
        );
        let st = forbidden_status(&u, &req("get", "apps", "deployments", "", "kd", "d"));
        assert_eq!(st["code"], 403);
        assert_eq!(st["reason"], "Forbidden");
        assert_eq!(
            st["details"],
            json!({"name": "d", "group": "apps", "kind": "deployments"})
        );
    }
}
