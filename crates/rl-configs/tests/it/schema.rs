//! The committed JSON Schemas under docs/ match the code; a stale one is rewritten and the test fails.

use rl_configs::{EnvServerConfig, RlConfig, SftConfig, schema_json};

/// Rewrites the file when its contents differ; returns whether it was stale.
fn ensure_file_contents(relative: &str, contents: &str) -> bool {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative);
    if std::fs::read_to_string(&path).is_ok_and(|current| current == contents) {
        return false;
    }
    std::fs::write(&path, contents).expect("rewrite the schema");
    true
}

#[test]
fn committed_schemas_are_fresh() {
    let stale: Vec<&str> = [
        ("docs/config-schema.json", schema_json::<RlConfig>()),
        ("docs/sft-config-schema.json", schema_json::<SftConfig>()),
        ("docs/env-server-config-schema.json", schema_json::<EnvServerConfig>()),
    ]
    .iter()
    .filter(|(file, contents)| ensure_file_contents(file, contents))
    .map(|(file, _)| *file)
    .collect();
    assert!(stale.is_empty(), "stale schemas regenerated, review and commit them: {stale:?}");
}

#[test]
fn every_field_has_a_description() {
    let schema: serde_json::Value = serde_json::from_str(&schema_json::<RlConfig>()).unwrap();
    let mut missing = Vec::new();
    let mut visit = |name: &str, def: &serde_json::Value| {
        if let Some(props) = def.get("properties").and_then(|p| p.as_object()) {
            for (key, prop) in props {
                if key != "id" && key != "type" && prop.get("description").is_none() {
                    missing.push(format!("{name}.{key}"));
                }
            }
        }
    };
    visit("RlConfig", &schema);
    for (name, def) in schema["$defs"].as_object().unwrap() {
        visit(name, def);
        for variant in def.get("oneOf").and_then(|v| v.as_array()).into_iter().flatten() {
            visit(name, variant);
        }
    }
    assert!(missing.is_empty(), "fields without a doc comment: {missing:?}");
}
