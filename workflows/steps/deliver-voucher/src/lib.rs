//! Fulfilment step `deliver-voucher`: delivers the booking's voucher with its tickets
//! (`vouchers.deliver-voucher`) and hands on `{"voucherUrl": .., "tickets": [..]}` with whatever
//! earlier steps handed over.
//!
//! The tickets are the input's `tickets` (from `issue-tickets`), or, when no earlier step handed
//! any over, the tickets the booking already has. A voucher error is returned unchanged.

use capstan_step_sdk::{Ctx, Descriptor, Error, Handover, LogLevel, Step, Ticket, TicketJson};

pub struct DeliverVoucher;

impl Step for DeliverVoucher {
    type Input = Handover;
    type Output = Handover;

    fn describe() -> Descriptor {
        Descriptor::new("deliver-voucher", env!("CARGO_PKG_VERSION"))
            .description("Delivers the booking's voucher with its tickets.")
    }

    fn run(ctx: &mut Ctx, input: Handover) -> Result<Handover, Error> {
        let booking = ctx.booking();
        let tickets: Vec<Ticket> = match input.get::<Vec<TicketJson>>("tickets")? {
            Some(handed_over) => handed_over.into_iter().map(Ticket::from).collect(),
            None => booking.tickets,
        };
        let voucher = ctx
            .vouchers()
            .deliver_voucher(&booking.booking_id, &tickets)?;
        ctx.log(
            LogLevel::Info,
            &format!(
                "voucher of booking {} delivered: {}",
                booking.booking_id, voucher.url
            ),
        );
        let tickets: Vec<TicketJson> = tickets.into_iter().map(TicketJson::from).collect();
        input
            .with("tickets", tickets)?
            .with("voucherUrl", voucher.url)
    }
}

capstan_step_sdk::export_step!(DeliverVoucher);

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_step_sdk::harness::{Harness, sample_booking};
    use capstan_step_sdk::json;

    #[test]
    fn delivers_the_handed_over_tickets_and_hands_on_the_voucher_url() {
        let input = json!({
            "supplierReference": "SUP-B-1",
            "tickets": [{"publicId": "T1", "url": "https://t/1.png", "type": "QRCODE"}]
        });
        let report = Harness::new()
            .reply(
                "vouchers.deliver-voucher",
                json!({"url": "https://v/B-1.pdf"}),
            )
            .run::<DeliverVoucher>(input.clone());
        assert_eq!(
            report.calls("vouchers.deliver-voucher")[0].request,
            json!({"booking_id": "B-1", "tickets": [
                {"public_id": "T1", "url": "https://t/1.png", "type_": "QRCODE"}
            ]})
        );
        let mut expected = input;
        expected["voucherUrl"] = json!("https://v/B-1.pdf");
        assert_eq!(report.output.unwrap(), expected);
    }

    #[test]
    fn without_handed_over_tickets_it_uses_the_bookings_own() {
        let mut booking = sample_booking();
        booking["tickets"] = json!([{"public_id": "OLD-1", "url": null, "type_": "TEXT"}]);
        let report = Harness::new()
            .booking(booking)
            .reply(
                "vouchers.deliver-voucher",
                json!({"url": "https://v/B-1.pdf"}),
            )
            .run::<DeliverVoucher>(json!(null));
        assert_eq!(
            report.output.unwrap(),
            json!({
                "tickets": [{"publicId": "OLD-1", "url": null, "type": "TEXT"}],
                "voucherUrl": "https://v/B-1.pdf"
            })
        );
    }

    #[test]
    fn malformed_tickets_in_the_input_are_a_permanent_error() {
        let report = Harness::new().run::<DeliverVoucher>(json!({"tickets": "nope"}));
        let error = report.output.unwrap_err();
        assert!(!error.is_transient());
        assert_eq!(error.code, "invalid-input");
    }
}
