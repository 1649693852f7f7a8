//! The published contract (`contract/*.schema.json`) as validators of the
//! `jsonschema` crate, a JSON Schema implementation the project did not
//! write. Tests check what deductor writes the way a consumer holding only
//! the schemas would, so a change to the outcome JSON or the dead-letter
//! headers that the schemas do not allow fails a test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use jsonschema::Validator;
use serde_json::Value;

/// The schema files of `contract/`, by file stem.
pub const SCHEMAS: [&str; 8] = [
    "order-placed",
    "order-refunded",
    "deduct-accepted",
    "deduct-rejected",
    "rollback-applied",
    "rollback-rejected",
    "dead-letter-headers",
    "outcome-headers",
];

pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("contract")
}

/// A schema file's JSON.
pub fn load(stem: &str) -> Value {
    let path = dir().join(format!("{stem}.schema.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// The schema file (stem) for a document's `type`: events and outcomes.
pub fn stem_of_type(t: &str) -> Option<&'static str> {
    Some(match t {
        "OrderPlaced" => "order-placed",
        "OrderRefunded" => "order-refunded",
        "DeductAccepted" => "deduct-accepted",
        "DeductRejected" => "deduct-rejected",
        "RollbackApplied" => "rollback-applied",
        "RollbackRejected" => "rollback-rejected",
        _ => return None,
    })
}

/// The validator of one schema, built once per test binary. Formats are
/// asserted (`processed_at` is a `date-time`), as a strict consumer would.
pub fn validator(stem: &str) -> &'static Validator {
    static ALL: OnceLock<BTreeMap<&'static str, Validator>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        SCHEMAS
            .iter()
            .map(|s| {
                let v = jsonschema::options()
                    .should_validate_formats(true)
                    .build(&load(s))
                    .unwrap_or_else(|e| panic!("contract/{s}.schema.json does not compile: {e}"));
                (*s, v)
            })
            .collect()
    });
    all.get(stem)
        .unwrap_or_else(|| panic!("no schema contract/{stem}.schema.json"))
}

/// Every error of `doc` against the schema `stem` (empty: valid).
pub fn errors(stem: &str, doc: &Value) -> Vec<String> {
    validator(stem)
        .iter_errors(doc)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// Every error of an outcome against the schema its `type` names.
pub fn outcome_errors(outcome: &Value) -> Vec<String> {
    let t = outcome["type"].as_str().unwrap_or_default();
    match stem_of_type(t) {
        Some(stem) if !stem.starts_with("order-") => errors(stem, outcome),
        _ => vec![format!("type {t:?} is not an outcome type")],
    }
}

/// Panics unless `outcome` is valid against its type's schema.
pub fn assert_outcome(outcome: &Value) {
    let errs = outcome_errors(outcome);
    assert!(
        errs.is_empty(),
        "outcome breaks contract/{}.schema.json:\n  {}\n{outcome}",
        stem_of_type(outcome["type"].as_str().unwrap_or_default()).unwrap_or("?"),
        errs.join("\n  ")
    );
}

/// Panics unless a dead letter's headers are valid against
/// `contract/dead-letter-headers.schema.json`.
pub fn assert_dead_letter_headers(headers: &BTreeMap<String, String>) {
    let doc = serde_json::to_value(headers).unwrap_or_default();
    let errs = errors("dead-letter-headers", &doc);
    assert!(
        errs.is_empty(),
        "dead-letter headers break contract/dead-letter-headers.schema.json:\n  {}\n{doc}",
        errs.join("\n  ")
    );
}

/// Panics unless an outcome's headers are valid against
/// `contract/outcome-headers.schema.json`.
pub fn assert_outcome_headers(headers: &BTreeMap<String, String>) {
    let doc = serde_json::to_value(headers).unwrap_or_default();
    let errs = errors("outcome-headers", &doc);
    assert!(
        errs.is_empty(),
        "outcome headers break contract/outcome-headers.schema.json:\n  {}\n{doc}",
        errs.join("\n  ")
    );
}
