//! DSSE, the envelope a Sigstore bundle signs a statement in: what its
//! signature covers. A leaf: both the keyed check (`sigstore.rs`) and the
//! keyless one (`keyless.rs`) verify a signature over this encoding.

/// The DSSE payload type of an in-toto statement.
pub const IN_TOTO: &str = "application/vnd.in-toto+json";

/// DSSE's pre-authentication encoding of a payload.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_is_dsses() {
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
    }
}
