//! The invariant the API server's audit log judges: no controller wrote while it did not hold
//! the Lease (its ControllerLease). A replica is told apart by its user agent
//! (`holdfast-controller/VERSION (IDENTITY)`, `holdfast_runtime::user_agent`); its terms are read
//! from the lease writes the log records, as the controller suite's fencing test reads them for
//! one cut. The writes the term fence refused are counted: the late writes it kept out.

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::faults::Cut;
use crate::audit::Event;

/// How soon after a cut link resumes the requests it held reach the API server (the relay
/// forwards them at once; a second is ample on loopback).
const DELIVERY: SignedDuration = SignedDuration::from_secs(1);

/// The Lease identity in a controller's user agent; none for any other client.
fn replica(event: &Event) -> Option<&str> {
    let (_, rest) = event
        .user_agent
        .strip_prefix("holdfast-controller/")?
        .split_once(" (")?;
    rest.strip_suffix(')')
}

/// One replica's hold of the Lease: from its acquiring write (received, completed) on, until
/// another replica's acquiring write.
#[derive(Debug)]
struct Term<'a> {
    holder: &'a str,
    received: Timestamp,
    completed: Timestamp,
}

/// What the audit log showed of the controllers' writes.
#[derive(Debug, Default)]
pub struct Judgement {
    /// Successful writes of controller replicas, the Lease's own aside.
    pub writes: usize,
    /// Those not made wholly inside a term of their replica's own, each as a line for the report.
    pub outside: Vec<String>,
    /// Of those, the ones a cut link held and delivered after the takeover: received within
    /// [`DELIVERY`] of the writer's link resuming. What a client cannot recall once sent, and
    /// the term fence refuses in the API server (SECURITY.md, "The term fence"): each one the
    /// fence let through.
    pub delivered_late: Vec<String>,
    /// Writes of controller replicas the term fence refused (`crate::accounts::TERM_FENCE`):
    /// each one a write that would have landed outside its replica's term.
    pub refused_by_term_fence: usize,
}

/// Judges every successful write of a controller replica (the lease's own aside): it must be
/// made wholly inside a term of its own, neither received before its acquiring write completed
/// nor completed after the next holder's acquiring write was received. Those one of `cuts` held
/// (received within [`DELIVERY`] of that replica's link resuming) are listed apart as well.
pub fn judge(events: &[Event], namespace: &str, lease: &str, cuts: &[Cut]) -> Judgement {
    let mut writes: Vec<(&Event, &str)> = events
        .iter()
        .filter(|e| e.is_lease(namespace, lease) && e.succeeded())
        .filter_map(|e| Some((e, replica(e)?)))
        .collect();
    writes.sort_by_key(|(e, _)| e.stage_timestamp);
    let mut terms: Vec<Term> = Vec::new();
    for (event, holder) in writes {
        if terms.last().map(|t| t.holder) != Some(holder) {
            terms.push(Term {
                holder,
                received: event.request_received_timestamp,
                completed: event.stage_timestamp,
            });
        }
    }
    let held = |write: &Event, writer: &str| {
        cuts.iter().any(|cut| {
            cut.replica == writer
                && write.request_received_timestamp >= cut.resumed
                && write.request_received_timestamp <= cut.resumed + DELIVERY
        })
    };
    let mut judgement = Judgement {
        refused_by_term_fence: events
            .iter()
            .filter(|e| replica(e).is_some() && e.refused_by(crate::accounts::TERM_FENCE))
            .count(),
        ..Judgement::default()
    };
    for (write, writer) in events
        .iter()
        .filter(|e| e.succeeded() && !e.is_lease(namespace, lease))
        .filter_map(|e| Some((e, replica(e)?)))
    {
        judgement.writes += 1;
        let next = terms.partition_point(|t| t.completed <= write.request_received_timestamp);
        let current = next.checked_sub(1).map(|i| &terms[i]);
        let outside = match (current, terms.get(next)) {
            (Some(term), _) if term.holder != writer => format!(
                "{writer} wrote while {} held the Lease: {}",
                term.holder,
                write.describe()
            ),
            (None, _) => format!(
                "{writer} wrote before any replica held the Lease: {}",
                write.describe()
            ),
            (_, Some(successor)) if successor.received < write.stage_timestamp => format!(
                "{writer}'s write completed after {}'s acquiring Lease write was received ({}): {}",
                successor.holder,
                successor.received,
                write.describe()
            ),
            _ => continue,
        };
        if held(write, writer) {
            judgement.delivered_late.push(outside.clone());
        }
        judgement.outside.push(outside);
    }
    judgement
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One audit line: `verb` of `resource`/`name` by replica `who` (an empty one: another
    /// client), received at second `received`, completed at `completed`.
    fn event(who: &str, resource: &str, name: &str, received: u32, completed: u32, code: u16) -> Event {
        let agent = if who.is_empty() {
            "kubectl/v1.37.2".to_string()
        } else {
            format!("holdfast-controller/0.1.0 ({who})")
        };
        let line = serde_json::json!({
            "auditID": format!("{who}-{received}"),
            "stage": "ResponseComplete",
            "verb": "update",
            "userAgent": agent,
            "user": {"username": "system:serviceaccount:holdfast-system:holdfast-controller"},
            "objectRef": {
                "resource": resource,
                "apiGroup": if resource == "controllerleases" { "holdfast.dev" } else { "" },
                "namespace": "holdfast-system",
                "name": name,
            },
            "responseStatus": {"code": code},
            "requestReceivedTimestamp": format!("2026-12-06T20:00:{received:02}.000000Z"),
            "stageTimestamp": format!("2026-12-06T20:00:{completed:02}.000000Z"),
        });
        serde_json::from_value(line).unwrap()
    }

    fn lease(who: &str, received: u32, completed: u32) -> Event {
        event(
            who,
            "controllerleases",
            "holdfast-controller",
            received,
            completed,
            200,
        )
    }

    fn pin(who: &str, received: u32, completed: u32) -> Event {
        event(who, "apps", "app", received, completed, 200)
    }

    fn judged(events: &[Event]) -> Vec<String> {
        judge(events, "holdfast-system", "holdfast-controller", &[]).outside
    }

    #[test]
    fn writes_inside_each_replicas_own_terms_pass() {
        let events = [
            lease("a", 1, 2),
            pin("a", 3, 4),
            lease("a", 5, 5),
            pin("a", 6, 7),
            lease("b", 20, 21),
            pin("b", 22, 23),
            // A failed write and another client's write are not the controllers'.
            event("a", "apps", "app", 24, 25, 409),
            event("", "apps", "app", 24, 25, 200),
            lease("a", 40, 41),
            pin("a", 42, 43),
        ];
        let judgement = judge(&events, "holdfast-system", "holdfast-controller", &[]);
        assert_eq!((judgement.writes, judgement.outside), (4, Vec::<String>::new()));
    }

    #[test]
    fn a_write_by_a_replica_that_did_not_hold_the_lease_is_reported() {
        let events = [lease("a", 1, 2), pin("b", 3, 4), pin("a", 5, 6)];
        let outside = judged(&events);
        assert_eq!(outside.len(), 1, "{outside:?}");
        assert!(
            outside[0].starts_with("b wrote while a held the Lease"),
            "{outside:?}"
        );
    }

    #[test]
    fn a_write_completed_after_the_successor_acquired_is_reported() {
        // A's write hung in its link and landed after B took over.
        let events = [
            lease("a", 1, 2),
            pin("a", 10, 30),
            lease("b", 25, 26),
            pin("b", 27, 28),
        ];
        let outside = judged(&events);
        assert_eq!(outside.len(), 1, "{outside:?}");
        assert!(
            outside[0].starts_with("a's write completed after b's acquiring Lease write"),
            "{outside:?}"
        );
    }

    /// The soak's CI run of issue 33: A's link hung with an apply on it; A stopped, B took over;
    /// the relay delivered the apply when the link resumed, and the API server wrote it. A
    /// violation (the term fence refuses it now), listed apart as what the cut held.
    #[test]
    fn a_write_a_cut_link_delivered_on_resuming_is_a_violation_listed_apart() {
        let resumed = |second: u32| Cut {
            replica: "a".into(),
            resumed: format!("2026-12-06T20:00:{second:02}.000000Z").parse().unwrap(),
        };
        let events = [
            lease("a", 1, 2),
            lease("b", 25, 26),
            pin("a", 40, 40),
            pin("a", 50, 50),
        ];
        let judgement = judge(&events, "holdfast-system", "holdfast-controller", &[resumed(40)]);
        assert_eq!(judgement.outside.len(), 2, "{judgement:?}");
        assert_eq!(
            judgement.delivered_late.len(),
            1,
            "a write ten seconds after the resume is no held one: {judgement:?}"
        );
        assert!(judgement.delivered_late[0].starts_with("a wrote while b held the Lease"));
        let judgement = judge(
            &events,
            "holdfast-system",
            "holdfast-controller",
            &[Cut {
                replica: "b".into(),
                ..resumed(40)
            }],
        );
        assert!(
            judgement.delivered_late.is_empty(),
            "another replica's cut held nothing of A's: {judgement:?}"
        );
    }

    #[test]
    fn a_write_the_term_fence_refused_is_counted_not_judged() {
        let refusal = |message: &str| {
            let mut write = pin("a", 30, 31);
            write.response_status = Some(crate::audit::ResponseStatus {
                code: 403,
                message: message.into(),
            });
            write
        };
        let refused = refusal(
            "digestcacheentries.holdfast.dev \"d-1\" is forbidden: ValidatingAdmissionPolicy 'holdfast-controller-term' with binding 'holdfast-controller-term' denied request: holdfast-controller writes only from the pod that holds its ControllerLease: a does not (b does)",
        );
        let other = refusal("apps.kappctrl.k14s.io \"app\" is forbidden: User cannot patch resource");
        let events = [lease("a", 1, 2), lease("b", 25, 26), refused, other];
        let judgement = judge(&events, "holdfast-system", "holdfast-controller", &[]);
        assert_eq!(
            judgement.refused_by_term_fence, 1,
            "an RBAC 403 is not the term fence's"
        );
        assert!(judgement.outside.is_empty(), "{:?}", judgement.outside);
    }

    #[test]
    fn a_write_before_any_lease_is_reported() {
        let outside = judged(&[pin("a", 1, 2), lease("a", 3, 4)]);
        assert_eq!(outside.len(), 1, "{outside:?}");
        assert!(outside[0].contains("before any replica held"), "{outside:?}");
    }
}
