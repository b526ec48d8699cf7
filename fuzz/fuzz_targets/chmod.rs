//! `--chmod RULES`: the first four bytes are the mode it is applied to.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let mode = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    if let Ok(rules) = std::str::from_utf8(&data[4..]) {
        packsync::fuzzing::chmod(rules, mode);
    }
});
