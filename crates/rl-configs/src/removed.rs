//! Keys the schema dropped because they changed nothing: a config that still sets one is refused
//! with the reason (an unknown key would only say it is unknown).

/// (the key's last part, why it was removed).
const REMOVED: &[(&str, &str)] = &[(
    "micro_batch_tokens",
    "it never changed a step: every packed row of `seq_len` tokens is one forward and backward, and \
     the rows' gradients are summed, so memory is bounded by `seq_len`",
)];

/// Why the key ending in `leaf` was removed, if it was.
pub(crate) fn removed(leaf: &str) -> Option<&'static str> {
    REMOVED.iter().find(|(k, _)| *k == leaf).map(|(_, why)| *why)
}
