//! A booking's status and the moves between them: the one table every path that changes a
//! booking (create, capture, cancel, reschedule, the capture-window timeout, fulfilment) asks.
//!
//! | from \ to       | PENDING | COMPLETED | FAILED | CANCELLED | CAPTURE_TIMEOUT |
//! |-----------------|---------|-----------|--------|-----------|-----------------|
//! | UNCAPTURED      | capture |           |        | cancel    | timeout         |
//! | PENDING         |         | fulfilled | failed | cancel    |                 |
//! | COMPLETED       |         |           |        | cancel    |                 |
//!
//! FAILED, CANCELLED and CAPTURE_TIMEOUT are final. A reschedule keeps the status (UNCAPTURED,
//! PENDING or COMPLETED) and moves the seats to another slot. The statuses that hold seats are
//! UNCAPTURED, PENDING and COMPLETED: for every slot, seats taken = Σ pax of its bookings in
//! those, which every move keeps true by moving exactly the seats the booking held.

use serde::{Deserialize, Serialize};

/// The status of a booking, as the partner document spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum BookingStatus {
    /// Created; holds its seats until captured or the capture window closes.
    Uncaptured,
    /// Captured; fulfilment runs.
    Pending,
    /// Fulfilled: tickets issued.
    Completed,
    /// Fulfilment failed; the seats were returned.
    Failed,
    /// Cancelled by the partner; the seats were returned.
    Cancelled,
    /// Not captured within the capture window; the seats were returned.
    CaptureTimeout,
}

impl BookingStatus {
    pub const ALL: [Self; 6] = [
        Self::Uncaptured,
        Self::Pending,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
        Self::CaptureTimeout,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Uncaptured => "UNCAPTURED",
            Self::Pending => "PENDING",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::Cancelled => "CANCELLED",
            Self::CaptureTimeout => "CAPTURE_TIMEOUT",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }

    /// Whether a booking in this status holds its seats.
    pub fn holds_seats(self) -> bool {
        matches!(self, Self::Uncaptured | Self::Pending | Self::Completed)
    }

    /// Whether the engine moves a booking from `self` to `to` (the table above).
    pub fn may_become(self, to: Self) -> bool {
        use BookingStatus::*;
        matches!(
            (self, to),
            (Uncaptured, Pending | Cancelled | CaptureTimeout)
                | (Pending, Completed | Failed | Cancelled)
                | (Completed, Cancelled)
        )
    }

    /// Whether a booking in this status may move to another slot (keeping its status).
    pub fn may_reschedule(self) -> bool {
        self.holds_seats()
    }
}

impl std::fmt::Display for BookingStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::BookingStatus;

    #[test]
    fn names_round_trip_and_final_statuses_go_nowhere() {
        for status in BookingStatus::ALL {
            assert_eq!(BookingStatus::parse(status.as_str()), Some(status));
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                serde_json::Value::from(status.as_str())
            );
            if !status.holds_seats() {
                assert!(
                    BookingStatus::ALL.iter().all(|to| !status.may_become(*to)),
                    "{status} is final"
                );
            }
        }
        assert_eq!(BookingStatus::parse("pending"), None);
    }

    /// Every move that ends holding seats starts holding them: a seat is never taken twice by
    /// a status change (only creates and reschedules take seats).
    #[test]
    fn no_move_takes_seats() {
        for from in BookingStatus::ALL {
            for to in BookingStatus::ALL {
                if from.may_become(to) && to.holds_seats() {
                    assert!(from.holds_seats(), "{from} → {to}");
                }
            }
        }
    }
}
