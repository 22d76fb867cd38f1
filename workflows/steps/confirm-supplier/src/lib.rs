//! Fulfilment step `confirm-supplier`: confirms the booking with the product's supplier
//! (`supplier.confirm` with the booking's id, product, variant, start and `pax` = the number of
//! customers) and hands on `{"supplierReference": ..}` with whatever earlier steps handed over.
//! A supplier error (a refusal is permanent, a timeout transient) is returned unchanged.
//!
//! Compensation (the booking was cancelled) cancels the confirmation by its reference
//! (`supplier.cancel-confirmation`); without one the step never confirmed, and there is nothing
//! to cancel.

use capstan_step_sdk::{Ctx, Descriptor, Error, Handover, LogLevel, Step};

pub struct ConfirmSupplier;

impl Step for ConfirmSupplier {
    type Input = Handover;
    type Output = Handover;

    fn describe() -> Descriptor {
        Descriptor::new("confirm-supplier", env!("CARGO_PKG_VERSION"))
            .description("Confirms the booking with the product's supplier.")
    }

    fn run(ctx: &mut Ctx, input: Handover) -> Result<Handover, Error> {
        let booking = ctx.booking();
        let pax = u32::try_from(booking.customers.len()).unwrap_or(u32::MAX);
        let confirmation = ctx.supplier().confirm(
            &booking.booking_id,
            &booking.product_id,
            &booking.variant_id,
            &booking.start_date_time,
            pax,
        )?;
        ctx.log(
            LogLevel::Info,
            &format!(
                "booking {} confirmed by the supplier as {}",
                booking.booking_id, confirmation.supplier_reference
            ),
        );
        input.with("supplierReference", confirmation.supplier_reference)
    }

    fn compensate(ctx: &mut Ctx, handover: Handover) -> Result<(), Error> {
        let Some(reference) = handover.get::<String>("supplierReference")? else {
            return Ok(());
        };
        ctx.supplier().cancel_confirmation(&reference)?;
        ctx.log(
            LogLevel::Info,
            &format!("supplier confirmation {reference} cancelled"),
        );
        Ok(())
    }
}

capstan_step_sdk::export_step!(ConfirmSupplier);

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_step_sdk::harness::Harness;
    use capstan_step_sdk::json;

    #[test]
    fn compensation_cancels_the_confirmation_it_made_and_nothing_without_one() {
        let report = Harness::new()
            .reply(
                "supplier.cancel-confirmation",
                json!({"supplier_reference": "SUP-B-1"}),
            )
            .compensate::<ConfirmSupplier>(json!({"supplierReference": "SUP-B-1"}));
        assert!(report.output.is_ok(), "{:?}", report.output);
        assert_eq!(
            report.calls("supplier.cancel-confirmation")[0].request,
            json!({"supplier_reference": "SUP-B-1"})
        );
        let report = Harness::new().compensate::<ConfirmSupplier>(json!(null));
        assert!(report.output.is_ok());
        assert!(report.ops().is_empty(), "{:?}", report.ops());
    }

    #[test]
    fn confirms_with_the_bookings_ids_and_party_size_and_hands_on_the_reference() {
        let report = Harness::new()
            .reply("supplier.confirm", json!({"supplier_reference": "SUP-B-1"}))
            .run::<ConfirmSupplier>(json!(null));
        assert_eq!(
            report.output.as_ref().unwrap(),
            &json!({"supplierReference": "SUP-B-1"})
        );
        assert_eq!(
            report.ops(),
            ["booking.current", "supplier.confirm", "context.log"]
        );
        assert_eq!(
            report.calls("supplier.confirm")[0].request,
            json!({
                "booking_id": "B-1", "product_id": "1001", "variant_id": "2001",
                "start_date_time": "2026-12-31T09:00:00", "pax": 2
            })
        );
    }

    #[test]
    fn keeps_what_earlier_steps_handed_over() {
        let report = Harness::new()
            .reply("supplier.confirm", json!({"supplier_reference": "S"}))
            .run::<ConfirmSupplier>(json!({"note": "from an earlier step"}));
        assert_eq!(
            report.output.unwrap(),
            json!({"note": "from an earlier step", "supplierReference": "S"})
        );
    }

    #[test]
    fn a_supplier_refusal_is_returned_unchanged() {
        let refusal = Error::permanent("supplier-rejected", "sold out at the supplier");
        let report = Harness::new()
            .fail("supplier.confirm", refusal.clone())
            .run::<ConfirmSupplier>(json!(null));
        assert_eq!(report.output.as_ref().unwrap_err(), &refusal);
        assert!(report.calls("context.log").is_empty());
    }
}
