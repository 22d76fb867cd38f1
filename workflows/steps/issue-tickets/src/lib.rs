//! Fulfilment step `issue-tickets`: issues the booking's admission tickets
//! (`admission.issue-tickets`) and hands on `{"tickets": [{"publicId", "url", "type"}]}` with
//! whatever earlier steps handed over.
//!
//! One ticket per customer, unless the input says `"ticketsPer": "booking"` (one ticket for the
//! whole party, for per-group products). An admission error is returned unchanged.
//!
//! Compensation (the booking was cancelled) voids the booking's tickets
//! (`admission.void-tickets`, by booking id, so also tickets issued by a run whose output was
//! lost in a crash).

use capstan_step_sdk::{Ctx, Descriptor, Error, Handover, LogLevel, Step, TicketJson};

pub struct IssueTickets;

impl Step for IssueTickets {
    type Input = Handover;
    type Output = Handover;

    fn describe() -> Descriptor {
        Descriptor::new("issue-tickets", env!("CARGO_PKG_VERSION"))
            .description("Issues the booking's admission tickets (one per person by default).")
    }

    fn run(ctx: &mut Ctx, input: Handover) -> Result<Handover, Error> {
        let booking = ctx.booking();
        let per_booking = input
            .get::<String>("ticketsPer")?
            .is_some_and(|per| per.eq_ignore_ascii_case("booking"));
        let count = if per_booking {
            1
        } else {
            u32::try_from(booking.customers.len().max(1)).unwrap_or(u32::MAX)
        };
        let tickets = ctx.admission().issue_tickets(&booking.booking_id, count)?;
        ctx.log(
            LogLevel::Info,
            &format!(
                "issued {} ticket(s) for booking {}",
                tickets.len(),
                booking.booking_id
            ),
        );
        let tickets: Vec<TicketJson> = tickets.into_iter().map(TicketJson::from).collect();
        input.with("tickets", tickets)
    }

    fn compensate(ctx: &mut Ctx, _handover: Handover) -> Result<(), Error> {
        let booking = ctx.booking();
        let voided = ctx.admission().void_tickets(&booking.booking_id)?;
        ctx.log(
            LogLevel::Info,
            &format!(
                "voided {} ticket(s) of booking {}",
                voided.len(),
                booking.booking_id
            ),
        );
        Ok(())
    }
}

capstan_step_sdk::export_step!(IssueTickets);

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_step_sdk::harness::{Harness, sample_booking};
    use capstan_step_sdk::{Value, json};

    fn issuer(request: &Value) -> Result<Value, Error> {
        let count = request["count"].as_u64().unwrap();
        Ok((1..=count)
            .map(|n| json!({"public_id": format!("T{n}"), "url": null, "type_": "QRCODE"}))
            .collect())
    }

    #[test]
    fn issues_one_ticket_per_person_and_hands_them_on_in_the_bookings_shape() {
        let report = Harness::new()
            .fake("admission.issue-tickets", issuer)
            .run::<IssueTickets>(json!({"supplierReference": "SUP-B-1"}));
        assert_eq!(
            report.calls("admission.issue-tickets")[0].request,
            json!({"booking_id": "B-1", "count": 2})
        );
        assert_eq!(
            report.output.unwrap(),
            json!({
                "supplierReference": "SUP-B-1",
                "tickets": [
                    {"publicId": "T1", "url": null, "type": "QRCODE"},
                    {"publicId": "T2", "url": null, "type": "QRCODE"}
                ]
            })
        );
    }

    #[test]
    fn one_ticket_for_the_party_when_asked_and_at_least_one_without_customers() {
        let report = Harness::new()
            .fake("admission.issue-tickets", issuer)
            .run::<IssueTickets>(json!({"ticketsPer": "booking"}));
        assert_eq!(
            report.calls("admission.issue-tickets")[0].request["count"],
            1
        );

        let mut nobody = sample_booking();
        nobody["customers"] = json!([]);
        let report = Harness::new()
            .booking(nobody)
            .fake("admission.issue-tickets", issuer)
            .run::<IssueTickets>(json!(null));
        assert_eq!(
            report.calls("admission.issue-tickets")[0].request["count"],
            1
        );
    }

    #[test]
    fn compensation_voids_the_bookings_tickets() {
        let report = Harness::new()
            .reply("admission.void-tickets", json!([]))
            .compensate::<IssueTickets>(json!({"tickets": []}));
        assert!(report.output.is_ok(), "{:?}", report.output);
        assert_eq!(
            report.calls("admission.void-tickets")[0].request,
            json!({"booking_id": "B-1"})
        );
    }

    #[test]
    fn a_transient_admission_error_is_returned_unchanged() {
        let busy = Error::transient("throttled", "try again");
        let report = Harness::new()
            .fail("admission.issue-tickets", busy.clone())
            .run::<IssueTickets>(json!(null));
        let error = report.output.unwrap_err();
        assert!(error.is_transient());
        assert_eq!(error, busy);
    }
}
