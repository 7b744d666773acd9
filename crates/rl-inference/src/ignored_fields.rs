//! Request fields the server reads past: named once per field in its log, as vLLM warns, except
//! those that change nothing here by design.

/// Fields clients send that change nothing here by design: the prompt cache is emptied on every
/// weight swap (`cache_salt`), and OpenAI's end-user id, stored-completion and tier fields.
const INERT_FIELDS: &[&str] =
    &["cache_salt", "user", "metadata", "store", "service_tier", "spaces_between_special_tokens"];

/// Says once per field name (per process) that requests carry a field this server ignores, as
/// vLLM warns: an option a client relies on (`best_of`, `bad_words`, ...) silently doing
/// nothing is worse than a line in the log.
pub(crate) fn warn_once(paths: &[String]) {
    static WARNED: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let fresh: Vec<&String> = paths.iter().filter(|p| !INERT_FIELDS.contains(&p.as_str())).collect();
    if fresh.is_empty() {
        return;
    }
    let mut warned = WARNED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for path in fresh {
        if warned.insert(path.clone()) {
            tracing::warn!(field = %path, "requests carry a field this server ignores (said once per field)");
        }
    }
}
