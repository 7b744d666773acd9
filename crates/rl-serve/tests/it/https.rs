//! `https://` model endpoints through the pure-Rust TLS stack: a chat call to a TLS server whose
//! certificate chains to a trusted root succeeds (by IP and by name); an untrusted certificate
//! fails at once as a bad request naming the TLS problem (not a retryable infrastructure error).
//! The server is test-only: a certificate for localhost and 127.0.0.1 issued by a test CA
//! (`tests/fixtures/tls`, see `make.py` there).

use std::sync::Arc;
use std::time::Duration;

use rl_serve::{Message, ModelClient, ModelRuntime, Sampling};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tls");

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{FIXTURES}/{name}")).unwrap()
}

/// A TLS server on 127.0.0.1 answering every request with one chat completion; returns its port.
async fn tls_server() -> u16 {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&fixture("server.pem")).collect::<Result<_, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_slice(&fixture("server.key")).unwrap();
    let provider = Arc::new(rustls_graviola::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                // One HTTP/1.1 request: headers, then a Content-Length body.
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let body_len = loop {
                    let Ok(n) = tls.read(&mut chunk).await else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| {
                                l.strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        break end + 4 + len;
                    }
                };
                while buf.len() < body_len {
                    let Ok(n) = tls.read(&mut chunk).await else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let reply = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "olleh"},
                                    "finish_reason": "stop"}]})
                .to_string();
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
                    reply.len()
                );
                let _ = tls.write_all(response.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    port
}

fn runtime(base_url: String) -> ModelRuntime {
    ModelRuntime {
        base_url,
        model: String::from("m"),
        sampling: Sampling::default(),
        tokens: false,
        cache_salt: None,
        timeout: Duration::from_secs(10),
        api_key: None,
        headers: Default::default(),
    }
}

fn test_ca() -> reqwest::Certificate {
    reqwest::Certificate::from_pem(&fixture("ca.pem")).unwrap()
}

#[tokio::test]
async fn https_endpoints_work_with_a_trusted_certificate() {
    let port = tls_server().await;
    let client = ModelClient::with_roots(&[test_ca()]);
    for host in ["127.0.0.1", "localhost"] {
        let reply = client
            .chat(&runtime(format!("https://{host}:{port}/v1")), &[Message::user("hello")], &[], None, 1, None)
            .await
            .unwrap();
        assert_eq!(reply.choices[0].message.content, "olleh", "{host}");
    }
}

#[tokio::test]
async fn untrusted_certificates_are_bad_requests_naming_the_tls_problem() {
    let port = tls_server().await;
    // The system's roots do not include the test CA.
    let e = ModelClient::new()
        .chat(&runtime(format!("https://127.0.0.1:{port}/v1")), &[Message::user("hello")], &[], None, 1, None)
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, rl_serve::Error::BadRequest { .. }), "{e:?}");
    assert!(text.contains("TLS") && text.to_lowercase().contains("certificate"), "{text}");
    // Plain HTTP to a TLS port is not mistaken for TLS trouble.
    let e = ModelClient::new()
        .chat(&runtime(format!("http://127.0.0.1:{port}/v1")), &[Message::user("hello")], &[], None, 1, None)
        .await
        .unwrap_err();
    assert!(!e.to_string().contains("TLS with"), "{e}");
}
