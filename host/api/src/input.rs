//! A trigger body as the workflow declares it, before anything is stored: every property the
//! input schema gives a `default` and the body leaves out is filled in, and every string whose
//! schema says `x-normalize` is trimmed and cased (`trim`, `lowercase` or `uppercase`). The
//! normalized body is what is validated, hashed for the idempotency key and stored as
//! `inputJson`, so a blank domain is a 400 and `" Example.ORG"` replays `"example.org"`.
//!
//! Only `properties` (objects nested through `$ref` into `$defs` included) are walked: what a
//! workflow declares there is what clients send.

use serde_json::Value;

/// `input` normalized by `schema` (unchanged where the schema says nothing).
pub fn normalize(schema: &Value, input: Value) -> Value {
    apply(schema, schema, input, 0)
}

/// Deeper than this, a schema is not walked further (a self-referencing `$ref`).
const MAX_DEPTH: usize = 16;

fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => r
            .strip_prefix('#')
            .and_then(|pointer| root.pointer(pointer))
            .unwrap_or(schema),
        None => schema,
    }
}

fn apply(root: &Value, schema: &Value, value: Value, depth: usize) -> Value {
    if depth > MAX_DEPTH {
        return value;
    }
    let schema = resolve(root, schema);
    match value {
        Value::String(s) => match schema.get("x-normalize").and_then(Value::as_str) {
            Some("trim") => Value::String(s.trim().to_owned()),
            Some("lowercase") => Value::String(s.trim().to_lowercase()),
            Some("uppercase") => Value::String(s.trim().to_uppercase()),
            _ => Value::String(s),
        },
        Value::Object(mut map) => {
            if let Some(Value::Object(properties)) = schema.get("properties") {
                for (name, property) in properties {
                    // A `default` beside a `$ref` belongs to the property, not to the target.
                    let default = property
                        .get("default")
                        .or_else(|| resolve(root, property).get("default"));
                    match map.remove(name) {
                        Some(v) => {
                            map.insert(name.clone(), apply(root, property, v, depth + 1));
                        }
                        None => {
                            if let Some(default) = default {
                                map.insert(
                                    name.clone(),
                                    apply(root, property, default.clone(), depth + 1),
                                );
                            }
                        }
                    }
                }
            }
            Value::Object(map)
        }
        other => other,
    }
}

/// For tests: an object schema from `(name, property schema)` pairs.
#[cfg(test)]
fn object(properties: &[(&str, Value)]) -> Value {
    let mut map = serde_json::Map::new();
    for (k, v) in properties {
        map.insert((*k).to_owned(), v.clone());
    }
    serde_json::json!({"type": "object", "properties": map})
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_fill_what_is_left_out_and_strings_are_normalized() {
        let schema = json!({
            "type": "object",
            "properties": {
                "domain": {"type": "string", "minLength": 1, "x-normalize": "lowercase"},
                "ticketId": {"type": "string", "x-normalize": "uppercase"},
                "isCms": {"type": "boolean", "default": true},
                "options": {"$ref": "#/$defs/Options", "default": {"dryRun": false}},
            },
            "$defs": {"Options": object(&[
                ("dryRun", json!({"type": "boolean", "default": false})),
                ("skipReadinessCheck", json!({"type": "boolean", "default": false})),
            ])},
        });
        assert_eq!(
            normalize(
                &schema,
                json!({"domain": "  Example.ORG ", "ticketId": " ops-1"})
            ),
            json!({"domain": "example.org", "ticketId": "OPS-1", "isCms": true,
                   "options": {"dryRun": false, "skipReadinessCheck": false}})
        );
        // What is sent is kept; a blank string stays blank (validation refuses it).
        assert_eq!(
            normalize(
                &schema,
                json!({"domain": "   ", "isCms": false, "options": {"dryRun": true}})
            ),
            json!({"domain": "", "isCms": false, "options": {"dryRun": true, "skipReadinessCheck": false}})
        );
        // Not an object: unchanged (validation answers it).
        assert_eq!(normalize(&schema, json!([1])), json!([1]));
    }
}
