//! What follows every commit to the store: the write-log entry
//! (`/_sim/writes`), the write counter (`/_sim/stats`), the revision that wakes
//! every watch stream, and, for a CustomResourceDefinition, the registry entry
//! that starts (or stops) serving its resource.

use serde_json::Value;

use super::ctx::Ctx;
use crate::registry::{self, ResourceInfo};
use crate::state::SimState;
use crate::status::{ApiError, ApiResult};
use crate::store::{Store, WriteRecord};

pub(super) fn record(ctx: &Ctx, st: &mut Store, verb: &str, name: &str, rv: u64) {
    record_raw(
        st,
        &ctx.sh,
        &ctx.user.name,
        verb,
        &ctx.info,
        ctx.namespace.as_deref().unwrap_or(""),
        name,
        rv,
    );
}

#[allow(clippy::too_many_arguments)]
pub(super) fn record_raw(
    st: &mut Store,
    sh: &SimState,
    user: &str,
    verb: &str,
    info: &ResourceInfo,
    ns: &str,
    name: &str,
    rv: u64,
) {
    let time_nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    st.record_write(WriteRecord {
        time_nanos,
        verb: verb.to_string(),
        group: info.group.clone(),
        resource: info.resource.clone(),
        namespace: ns.to_string(),
        name: name.to_string(),
        resource_version: rv.to_string(),
        user: user.to_string(),
    });
    sh.count_write(&info.resource);
    sh.rv_tx.send_replace(rv);
}

/// Effects of a committed write on the registry.
pub(super) fn after_write(
    st: &mut Store,
    info: &ResourceInfo,
    obj: &Value,
    deleted: bool,
) -> ApiResult<()> {
    if info.resource == "customresourcedefinitions" && info.group == "apiextensions.k8s.io" {
        if deleted {
            if let (Some(g), Some(p)) = (
                obj.pointer("/spec/group").and_then(Value::as_str),
                obj.pointer("/spec/names/plural").and_then(Value::as_str),
            ) {
                st.registry.remove(g, p);
            }
        } else if obj.pointer("/metadata/deletionTimestamp").is_none() {
            let ri = registry::from_crd(obj).map_err(ApiError::bad_request)?;
            st.registry.add_crd(ri);
        }
    }
    Ok(())
}
