//! Who is asking and what they may do: the bearer token of a request, and
//! RBAC evaluated over the Roles, ClusterRoles and bindings in the store
//! (the admin token bypasses it). A denial is the real server's 403 with its
//! message and details.

use hyper::HeaderMap;
use serde_json::json;

use super::ctx::Ctx;
use crate::machinery::{self, Attributes, RbacObjects, User};
use crate::state::SimState;
use crate::status::{ApiError, ApiResult};
use crate::store::{Key, Store};

pub(super) fn bearer(headers: &HeaderMap) -> Option<String> {
    let v = headers.get("authorization")?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}

pub(super) fn rbac_snapshot(st: &Store) -> RbacObjects {
    let take = |res: &str| {
        st.range(res, None)
            .map(|(_, v)| (**v).clone())
            .collect::<Vec<_>>()
    };
    RbacObjects {
        roles: take("rbac.authorization.k8s.io/roles"),
        cluster_roles: take("rbac.authorization.k8s.io/clusterroles"),
        role_bindings: take("rbac.authorization.k8s.io/rolebindings"),
        cluster_role_bindings: take("rbac.authorization.k8s.io/clusterrolebindings"),
    }
}

pub(super) fn authorize(sh: &SimState, user: &User, attrs: &Attributes) -> ApiResult<()> {
    if user.admin {
        return Ok(());
    }
    let objs = rbac_snapshot(&sh.lock());
    if machinery::authorize(user, attrs, &objs) {
        Ok(())
    } else {
        let mut e = ApiError::new(403, "Forbidden", machinery::forbidden_message(user, attrs));
        if attrs.resource_request {
            let mut d = json!({"kind": attrs.resource});
            if !attrs.name.is_empty() {
                d["name"] = json!(attrs.name);
            }
            if !attrs.api_group.is_empty() {
                d["group"] = json!(attrs.api_group);
            }
            e = e.with_details(d);
        }
        Err(e)
    }
}

/// A patch (apply) or update that would create the object needs `create`
/// too, as the real server authorizes a create-on-patch and create-on-update
/// (`withAuthorization` in k8s.io/apiserver's patch.go and update.go).
pub(super) fn authorize_create_on_write(ctx: &Ctx, key: &Key, name: &str) -> ApiResult<()> {
    if ctx.sh.lock().objects.contains_key(key) {
        return Ok(());
    }
    let attrs = Attributes {
        verb: "create".into(),
        api_group: ctx.info.group.clone(),
        resource: ctx.info.resource.clone(),
        subresource: ctx.sub.clone().unwrap_or_default(),
        namespace: ctx.namespace.clone().unwrap_or_default(),
        name: name.to_string(),
        resource_request: true,
        path: String::new(),
    };
    authorize(&ctx.sh, &ctx.user, &attrs)
}
