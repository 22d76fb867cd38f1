//! Booking requests as partners send them, parsed from JSON with the documented errors: a missing
//! required field is `E_MISSING_PARAMETER`, a field of the wrong type or value `E_INVALID_ARGUMENT`,
//! each naming the field.

use crate::BookingError;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub struct FieldValue {
    pub id: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Customer {
    pub person_type: String,
    pub is_primary: bool,
    pub input_fields: Vec<FieldValue>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CreateBooking {
    pub product_id: String,
    pub variant_id: String,
    pub inventory_id: String,
    pub inventory_seat_ids: Option<Vec<String>>,
    pub count: u32,
    pub customers: Vec<Customer>,
    pub variant_input_fields: Option<Vec<FieldValue>>,
    pub price_amount: f64,
    pub price_currency: String,
}

fn missing(field: &str) -> BookingError {
    BookingError::missing(format!("`{field}` is required"))
}
fn invalid(field: &str, expected: &str) -> BookingError {
    BookingError::invalid(format!("`{field}` must be {expected}"))
}

fn string(body: &Value, key: &str, path: &str) -> Result<String, BookingError> {
    match body.get(key) {
        None | Some(Value::Null) => Err(missing(path)),
        Some(Value::String(s)) if s.trim().is_empty() => Err(missing(path)),
        Some(Value::String(s)) => Ok(s.clone()),
        // Ids are strings, but v1 clients send numbers.
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(_) => Err(invalid(path, "a string")),
    }
}

fn fields(value: Option<&Value>, path: &str) -> Result<Vec<FieldValue>, BookingError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let items = value.as_array().ok_or_else(|| invalid(path, "an array"))?;
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let at = format!("{path}[{i}]");
            if !item.is_object() {
                return Err(invalid(&at, "an object {id, value}"));
            }
            let id = string(item, "id", &format!("{at}.id"))?;
            let value = match item.get("value") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(_) => return Err(invalid(&format!("{at}.value"), "a string")),
            };
            Ok(FieldValue { id, value })
        })
        .collect()
}

impl CreateBooking {
    pub fn parse(body: &Value) -> Result<Self, BookingError> {
        if !body.is_object() {
            return Err(BookingError::invalid("the body must be a JSON object"));
        }
        let product_id = string(body, "productId", "productId")?;
        let variant_id = string(body, "variantId", "variantId")?;
        let inventory_id = string(body, "inventoryId", "inventoryId")?;
        let inventory_seat_ids = match body.get("inventorySeatIds") {
            None | Some(Value::Null) => None,
            Some(Value::Array(items)) => Some(
                items
                    .iter()
                    .map(|s| {
                        s.as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| invalid("inventorySeatIds", "an array of strings"))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(_) => return Err(invalid("inventorySeatIds", "an array of strings or null")),
        };
        let details = match body.get("customersDetails") {
            None | Some(Value::Null) => return Err(missing("customersDetails")),
            Some(d) if d.is_object() => d,
            Some(_) => return Err(invalid("customersDetails", "an object {count, customers}")),
        };
        let count = match details.get("count") {
            None | Some(Value::Null) => return Err(missing("customersDetails.count")),
            Some(v) => v
                .as_u64()
                .filter(|n| (1..=1000).contains(n))
                .ok_or_else(|| invalid("customersDetails.count", "an integer from 1 to 1000"))?
                as u32,
        };
        let customers = match details.get("customers") {
            None | Some(Value::Null) => return Err(missing("customersDetails.customers")),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let at = format!("customersDetails.customers[{i}]");
                    if !c.is_object() {
                        return Err(invalid(&at, "an object"));
                    }
                    let person_type = string(c, "personType", &format!("{at}.personType"))?;
                    let is_primary = match c.get("isPrimary") {
                        None | Some(Value::Null) => false,
                        Some(Value::Bool(b)) => *b,
                        Some(_) => return Err(invalid(&format!("{at}.isPrimary"), "a boolean")),
                    };
                    let input_fields = fields(c.get("inputFields"), &format!("{at}.inputFields"))?;
                    Ok(Customer {
                        person_type,
                        is_primary,
                        input_fields,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err(invalid("customersDetails.customers", "an array")),
        };
        let variant_input_fields = match body.get("variantInputFields") {
            None | Some(Value::Null) => None,
            v => Some(fields(v, "variantInputFields")?),
        };
        let price = match body.get("price") {
            None | Some(Value::Null) => return Err(missing("price")),
            Some(p) if p.is_object() => p,
            Some(_) => return Err(invalid("price", "an object {amount, currencyCode}")),
        };
        let price_amount = match price.get("amount") {
            None | Some(Value::Null) => return Err(missing("price.amount")),
            Some(v) => v
                .as_f64()
                .filter(|a| a.is_finite() && *a >= 0.0)
                .ok_or_else(|| invalid("price.amount", "a number ≥ 0"))?,
        };
        let price_currency = string(price, "currencyCode", "price.currencyCode")?;
        Ok(Self {
            product_id,
            variant_id,
            inventory_id,
            inventory_seat_ids,
            count,
            customers,
            variant_input_fields,
            price_amount,
            price_currency,
        })
    }
}

/// The body of a capture (`PUT` booking).
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateBooking {
    pub status: crate::BookingStatus,
    pub partner_reference_id: Option<String>,
}

impl UpdateBooking {
    /// `v2`: `status` must be PENDING and `partnerReferenceId` is required.
    pub fn parse(body: &Value, v2: bool) -> Result<Self, BookingError> {
        if !body.is_object() {
            return Err(BookingError::invalid("the body must be a JSON object"));
        }
        let status = string(body, "status", "status")?;
        if v2 && status != "PENDING" {
            return Err(BookingError::invalid(format!(
                "`status` must be PENDING (the only status a partner sets), not `{status}`"
            )));
        }
        let status = crate::BookingStatus::parse(&status)
            .filter(|s| *s != crate::BookingStatus::CaptureTimeout)
            .ok_or_else(|| {
                invalid(
                    "status",
                    "one of PENDING, UNCAPTURED, COMPLETED, CANCELLED, FAILED",
                )
            })?;
        let partner_reference_id = match body.get("partnerReferenceId") {
            None | Some(Value::Null) if v2 => return Err(missing("partnerReferenceId")),
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.len() > 255 => {
                return Err(invalid("partnerReferenceId", "at most 255 characters"));
            }
            Some(Value::String(s)) if v2 && s.trim().is_empty() => {
                return Err(missing("partnerReferenceId"));
            }
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(invalid("partnerReferenceId", "a string")),
        };
        Ok(Self {
            status,
            partner_reference_id,
        })
    }
}
