//! What the record keeps of a service's conditions: status and
//! `lastTransitionTime` of `Ready` and `Degraded`, and the message of
//! `Degraded=True`. That is all a write reads back (the times of the
//! conditions that did not change, and whether `Degraded` is news), so the
//! rest of each condition is not kept.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::crd::conditions::{DEGRADED, READY};

/// What is kept of one service's conditions (see the module docs).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Kept {
    /// `Ready`, `Degraded`: status and `lastTransitionTime`.
    conds: [Option<(Status, jiff::Timestamp)>; 2],
    /// The message of `Degraded=True`.
    degraded_message: Option<Box<str>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    fn of(s: &str) -> Option<Status> {
        match s {
            "True" => Some(Status::True),
            "False" => Some(Status::False),
            "Unknown" => Some(Status::Unknown),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

const TYPES: [&str; 2] = [READY, DEGRADED];

impl Kept {
    pub(crate) fn of(conditions: &[Condition]) -> Kept {
        let mut k = Kept::default();
        for c in conditions {
            let (Some(i), Some(status)) = (
                TYPES.iter().position(|t| *t == c.type_),
                Status::of(&c.status),
            ) else {
                continue;
            };
            k.conds[i] = Some((status, c.last_transition_time.0));
            if i == 1 && status == Status::True {
                k.degraded_message = Some(c.message.as_str().into());
            }
        }
        k
    }

    /// The kept conditions as `Condition`s (reason empty: never read back).
    pub(crate) fn conditions(&self) -> Vec<Condition> {
        TYPES
            .iter()
            .zip(&self.conds)
            .filter_map(|(type_, c)| {
                let (status, time) = (*c)?;
                let message = match (*type_ == DEGRADED, status, &self.degraded_message) {
                    (true, Status::True, Some(m)) => m.to_string(),
                    _ => String::new(),
                };
                Some(Condition {
                    type_: (*type_).to_string(),
                    status: status.as_str().to_string(),
                    reason: String::new(),
                    message,
                    last_transition_time: Time(time),
                    observed_generation: None,
                })
            })
            .collect()
    }
}
