//! Checks `rust/xla_ffi.rs` against the real `xla/ffi/api/c_api.h` shipped by jaxlib: a C
//! program compiled against the header prints every size, offset and enum value that the
//! Rust mirror declares, and they must match exactly.
//!
//! The header is found through `HOSTFEED_XLA_FFI_INCLUDE` or, failing that, by asking the
//! Python interpreter (`PYO3_PYTHON` or `python3`) for `jax.ffi.include_dir()`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use _receiver::xla_ffi::{constant_table, layout_table};

fn include_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("HOSTFEED_XLA_FFI_INCLUDE") {
        return PathBuf::from(dir);
    }
    let python = std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args(["-c", "import jax; print(jax.ffi.include_dir())"])
        .output()
        .expect("run python to locate jax.ffi.include_dir()");
    assert!(
        out.status.success(),
        "cannot locate the XLA FFI header: install jax/jaxlib or set HOSTFEED_XLA_FFI_INCLUDE\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

#[test]
fn rust_mirror_matches_c_header() {
    let include = include_dir();
    assert!(include.join("xla/ffi/api/c_api.h").exists(), "no c_api.h under {include:?}");
    let layouts = layout_table();
    let constants = constant_table();
    let mut src = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"xla/ffi/api/c_api.h\"\nint main(void) {\n",
    );
    for (expr, _) in &layouts {
        let _ = writeln!(src, "  printf(\"%zu\\n\", (size_t)({expr}));");
    }
    for (expr, _) in &constants {
        let _ = writeln!(src, "  printf(\"%lld\\n\", (long long)({expr}));");
    }
    src.push_str("  return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("hostfeed_ffi_layout_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c_file = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&c_file, src).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(cc)
        .arg("-I")
        .arg(&include)
        .arg(&c_file)
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "compiling the layout probe failed");
    let out = Command::new(&exe).output().expect("run the layout probe");
    let text = String::from_utf8(out.stdout).unwrap();
    let values: Vec<&str> = text.lines().collect();
    assert_eq!(values.len(), layouts.len() + constants.len());
    let mut mismatches = Vec::new();
    for ((expr, rust), c) in layouts.iter().zip(&values) {
        if c.parse::<usize>().unwrap() != *rust {
            mismatches.push(format!("{expr}: C says {c}, Rust says {rust}"));
        }
    }
    for ((expr, rust), c) in constants.iter().zip(&values[layouts.len()..]) {
        if c.parse::<i64>().unwrap() != *rust {
            mismatches.push(format!("{expr}: C says {c}, Rust says {rust}"));
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(mismatches.is_empty(), "XLA FFI layout drift:\n{}", mismatches.join("\n"));
}
