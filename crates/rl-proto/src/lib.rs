//! Generated protobuf and gRPC types of the rl wire protocols: `env::v1` is the environment-server
//! protocol (`proto/rl/env/v1/env_server.proto`), `train::v1` the training batch the orchestrator
//! writes for the trainer (`proto/rl/train/v1/batch.proto`).
//!
//! This crate holds generated code only. It must not depend on candle or reqwest; without the
//! `grpc` feature it depends on prost alone (the trainer uses it that way).

/// The environment-server protocol, version 1 (feature `grpc`).
#[cfg(feature = "grpc")]
pub mod env {
    /// `rl.env.v1`.
    pub mod v1 {
        #![allow(missing_docs, unreachable_pub, missing_debug_implementations, clippy::all, clippy::pedantic)]
        tonic::include_proto!("rl.env.v1");
    }
}

/// The training-batch format, version 1.
pub mod train {
    /// `rl.train.v1`.
    pub mod v1 {
        #![allow(missing_docs, unreachable_pub, missing_debug_implementations, clippy::all, clippy::pedantic)]
        include!(concat!(env!("OUT_DIR"), "/rl.train.v1.rs"));
    }
}

#[cfg(all(test, feature = "grpc"))]
mod tests {
    use prost::Message;

    use super::env::v1::{ExampleRef, RunGroupRequest, TrainingContext, example_ref};

    #[test]
    fn messages_round_trip_through_bytes() {
        let req = RunGroupRequest {
            example: Some(ExampleRef {
                source: Some(example_ref::Source::InlineJson(String::from("{\"prompt\":\"ab\"}"))),
            }),
            group_size: 4,
            training_context: Some(TrainingContext { step: 7, ..Default::default() }),
            ..Default::default()
        };
        let bytes = req.encode_to_vec();
        assert_eq!(RunGroupRequest::decode(bytes.as_slice()).unwrap(), req);
    }
}
