//! The check that a step trains something within `seq_len`: a step whose samples are all cut
//! before their first trained token is an error naming `seq_len` and the lengths seen.

use crate::error::{Error, Result};
use crate::sink::TrainingSample;

/// A step whose every sample trains nothing within `seq_len` (its trained tokens all lie past the
/// cut) would train nothing, silently, step after step: an error naming `seq_len` and the lengths.
pub(crate) fn check_trainable_within(samples: &[TrainingSample], seq_len: usize) -> Result<()> {
    let trains = |s: &TrainingSample| {
        let n = s.ids.len().min(seq_len);
        s.loss_mask[..n].iter().zip(&s.ce_weights[..n]).any(|(m, w)| *m || *w != 0.0)
    };
    if samples.is_empty() || samples.iter().any(trains) {
        return Ok(());
    }
    let lens = samples.iter().map(|s| s.ids.len());
    let (shortest, longest) = (lens.clone().min().unwrap_or(0), lens.max().unwrap_or(0));
    let first_trained = samples
        .iter()
        .filter_map(|s| s.loss_mask.iter().zip(&s.ce_weights).position(|(m, w)| *m || *w != 0.0))
        .min()
        .unwrap_or(0);
    Err(Error::Config(format!(
        "seq_len ({seq_len}) cuts every sample of this step before its first trained token: the {} samples \
         are {shortest} to {longest} tokens long, the earliest trained token at position {first_trained}; \
         raise seq_len (at least {}) or shorten the prompts",
        samples.len(),
        first_trained + 1
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(prompt: usize, completion: usize) -> TrainingSample {
        let n = prompt + completion;
        let trained: Vec<bool> = (0..n).map(|i| i >= prompt).collect();
        TrainingSample {
            ids: vec![1; n],
            loss_mask: trained,
            advantages: vec![1.0; n],
            inference_logprobs: vec![0.0; n],
            temperatures: vec![1.0; n],
            ce_weights: vec![0.0; n],
            env_index: 0,
        }
    }

    #[test]
    fn a_step_that_trains_nothing_within_seq_len_is_an_error_naming_it() {
        let overlong = [sample(848, 16), sample(850, 10)];
        let err = check_trainable_within(&overlong, 256).unwrap_err().to_string();
        assert!(err.contains("seq_len (256)") && err.contains("848") && err.contains("at least 849"), "{err}");
        // One sample that still trains within seq_len keeps the step; so does a step of no samples.
        assert!(check_trainable_within(&[sample(848, 16), sample(100, 10)], 256).is_ok());
        assert!(check_trainable_within(&[], 256).is_ok());
        assert!(check_trainable_within(&[sample(300, 8)], 256).is_err());
        assert!(check_trainable_within(&[sample(250, 8)], 256).is_ok(), "cut, but trains");
    }
}
