//! Local, non-loopback addresses for test backends.
//!
//! The real API server refuses loopback (127.0.0.0/8), link-local and
//! unspecified addresses in Endpoints and EndpointSlices (`ValidateEndpointIP`
//! in `pkg/apis/core/validation`), so backends that tests list there cannot
//! listen on 127.0.x.y. They listen instead on addresses of the RFC 2544
//! benchmarking block 198.18.0.0/15, which the harness assigns to the `lo`
//! interface (`ip addr add <ip>/32 dev lo`): local to this machine, never
//! routed anywhere else, and accepted by the real server.
//!
//! Adding an address needs root (or CAP_NET_ADMIN); the tests run as root
//! here and in CI. Addresses are added once and left in place: adding is
//! idempotent, and removing one could pull it from under a concurrent test
//! process that uses it too. The one exception are the Pod addresses of a
//! kwok cluster ([`crate::kwok`]): each cluster holds a range of its own
//! (a lock file), adds a Pod's address while the Pod exists and removes it
//! ([`remove_local`]) when the Pod is gone.
//!
//! [`backend_ip`] gives each [`Backend`] its own half of the block (kube-sim
//! 198.18.x.y, real 198.19.x.y), so the two runs of a `#[both_backends]` test,
//! which run at the same time, never share a backend address.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::sync::Mutex;

use crate::{Backend, Error, Result};

/// The block addresses are taken from: 198.18.0.0/15 (RFC 2544).
pub const BLOCK: (Ipv4Addr, u8) = (Ipv4Addr::new(198, 18, 0, 0), 15);

/// Addresses this process has seen assigned to `lo` (by itself or another test process).
static ASSIGNED: Mutex<Option<HashSet<Ipv4Addr>>> = Mutex::new(None);

/// Whether `ip` is in [`BLOCK`].
pub fn in_block(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    o[0] == 198 && (o[1] & 0xfe) == 18
}

/// The address `198.<18|19>.<net>.<host>` for `backend`, assigned to `lo`.
pub fn backend_ip(backend: Backend, net: u8, host: u8) -> Result<Ipv4Addr> {
    let second = match backend {
        Backend::Sim => 18,
        Backend::Real => 19,
    };
    ensure_local(Ipv4Addr::new(198, second, net, host))
}

/// Makes sure `ip` (in [`BLOCK`]) is assigned to `lo`, adding it when not;
/// returns it. Fails with an explanation when it cannot be added.
pub fn ensure_local(ip: Ipv4Addr) -> Result<Ipv4Addr> {
    if !in_block(ip) {
        return Err(Error::NotInTestBlock { ip });
    }
    let mut guard = ASSIGNED.lock().unwrap_or_else(|p| p.into_inner());
    let known = guard.get_or_insert_with(HashSet::new);
    if known.contains(&ip) {
        return Ok(ip);
    }
    if !on_lo(ip)? {
        let out = Command::new("ip")
            .args(["addr", "add", &format!("{ip}/32"), "dev", "lo"])
            .output()
            .map_err(|e| {
                Error::io(
                    "running `ip addr add` (iproute2 is needed to give test backends local addresses)",
                    e,
                )
            })?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        // "File exists": another test process added it in the meantime.
        if !out.status.success() && !stderr.contains("File exists") {
            return Err(Error::AddAddress {
                ip,
                stderr: stderr.trim().to_string(),
            });
        }
        if !on_lo(ip)? {
            return Err(Error::AddressNotListed { ip });
        }
    }
    known.insert(ip);
    Ok(ip)
}

/// Removes `ip` (in [`BLOCK`]) from `lo`; an address that is not there is fine.
pub fn remove_local(ip: Ipv4Addr) -> Result<()> {
    if !in_block(ip) {
        return Err(Error::NotInTestBlock { ip });
    }
    let mut guard = ASSIGNED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(known) = guard.as_mut() {
        known.remove(&ip);
    }
    let out = Command::new("ip")
        .args(["addr", "del", &format!("{ip}/32"), "dev", "lo"])
        .output()
        .map_err(|e| Error::io("running `ip addr del`", e))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    // "Cannot assign requested address": it was not there.
    if !out.status.success() && !stderr.contains("Cannot assign requested address") {
        return Err(Error::RemoveAddress {
            ip,
            stderr: stderr.trim().to_string(),
        });
    }
    Ok(())
}

/// Makes `cidr` (in [`BLOCK`]) unreachable from this machine except for the
/// addresses on `lo` (`ip route add unreachable <cidr>`; local addresses win):
/// a request to a Pod address that is gone fails here ("No route to host")
/// instead of leaving through the default route. Added once, left in place.
pub fn unreachable_route(cidr: &str) -> Result<()> {
    let out = Command::new("ip")
        .args(["route", "add", "unreachable", cidr])
        .output()
        .map_err(|e| Error::io("running `ip route add`", e))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && !stderr.contains("File exists") {
        return Err(Error::PodNet(format!(
            "`ip route add unreachable {cidr}` failed: {}",
            stderr.trim()
        )));
    }
    Ok(())
}

/// The addresses of [`BLOCK`] that `lo` lists now.
pub fn listed_in_block() -> Result<Vec<Ipv4Addr>> {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show", "dev", "lo"])
        .output()
        .map_err(|e| Error::io("running `ip addr show`", e))?;
    if !out.status.success() {
        return Err(Error::ListAddresses(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.split_once('/').and_then(|(a, _)| a.parse().ok()))
        .filter(|ip| in_block(*ip))
        .collect())
}

/// Whether `ip` is an address [`ensure_local`] has made sure of in this process.
pub fn is_assigned(ip: IpAddr) -> bool {
    let IpAddr::V4(v4) = ip else {
        return false;
    };
    ASSIGNED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .is_some_and(|s| s.contains(&v4))
}

/// Whether `lo` lists `ip` (`ip -o -4 addr show dev lo`).
fn on_lo(ip: Ipv4Addr) -> Result<bool> {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show", "dev", "lo"])
        .output()
        .map_err(|e| {
            Error::io(
                "running `ip addr show` (iproute2 is needed to give test backends local addresses)",
                e,
            )
        })?;
    if !out.status.success() {
        return Err(Error::ListAddresses(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    let want = format!("inet {ip}/");
    Ok(String::from_utf8_lossy(&out.stdout).contains(&want))
}

/// One `GET /` on `addr` with `Connection: close`, bounded by 2 s:
/// `(status, body)` or what went wrong (connect, write, read, no HTTP
/// answer, timeout).
pub async fn http_get(addr: std::net::SocketAddr) -> std::result::Result<(u16, String), String> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        tokio::io::AsyncWriteExt::write_all(
            &mut s,
            format!("GET / HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .map_err(|e| format!("write: {e}"))?;
        let mut buf = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut s, &mut buf)
            .await
            .map_err(|e| format!("read: {e}"))?;
        let text = String::from_utf8_lossy(&buf).to_string();
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("no HTTP response: {text:?}"))?;
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("bad status line: {head:?}"))?;
        Ok((code, body.trim().to_string()))
    };
    tokio::time::timeout(std::time::Duration::from_secs(2), fut)
        .await
        .unwrap_or_else(|_| Err("timeout after 2s".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_bounds() {
        assert!(in_block(Ipv4Addr::new(198, 18, 0, 1)));
        assert!(in_block(Ipv4Addr::new(198, 19, 255, 254)));
        assert!(!in_block(Ipv4Addr::new(198, 17, 0, 1)));
        assert!(!in_block(Ipv4Addr::new(198, 20, 0, 1)));
        assert!(!in_block(Ipv4Addr::new(127, 0, 0, 1)));
    }
}
