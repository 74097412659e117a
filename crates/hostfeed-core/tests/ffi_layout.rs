//! Checks `src/ffi/c_api.rs` against the real `xla/ffi/api/c_api.h` shipped by jaxlib: a C
//! program compiled against the header prints every size, offset and enum value that the
//! Rust mirror declares; they must match exactly, except the few that a newer header may
//! only make larger (`minimum_table`: the API table's size, the API minor version).
//!
//! The headers are found through `HOSTFEED_XLA_FFI_INCLUDE`: one include directory, or
//! several separated like `PATH` (e.g. one per supported jaxlib, so one build is checked
//! against all of them). The nox `rust` session sets it from the jaxlibs its test sessions
//! installed, and sets `HOSTFEED_REQUIRE_FFI_HEADERS=1` so that a missing header fails
//! there. Elsewhere (`cargo test -p hostfeed-core` on a machine without JAX) the test
//! says that it skipped the check and passes: the core needs neither Python nor JAX.
#![cfg(not(loom))] // the loom build swaps the primitives; it runs only the models (--lib)

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use hostfeed_core::{constant_table, layout_table, minimum_table};

/// The include directories to check, or `None` when none was given.
fn include_dirs() -> Option<Vec<PathBuf>> {
    let dirs = std::env::var_os("HOSTFEED_XLA_FFI_INCLUDE")?;
    let dirs: Vec<PathBuf> = std::env::split_paths(&dirs).filter(|d| !d.as_os_str().is_empty()).collect();
    (!dirs.is_empty()).then_some(dirs)
}

/// The probe's source. Names that a header version renamed without changing the layout are
/// mapped back to the names the mirror uses.
fn probe_source(exprs: &[&str]) -> String {
    let mut src = String::from(concat!(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"xla/ffi/api/c_api.h\"\n",
        "#if XLA_FFI_API_MINOR >= 4\n",
        "/* API 0.4 (jaxlib 0.11.1) renamed XLA_FFI_Extension_Base; same fields. */\n",
        "typedef XLA_FFI_InternalExtension XLA_FFI_Extension_Base;\n",
        "#endif\n",
        "int main(void) {\n",
    ));
    for expr in exprs {
        let _ = writeln!(src, "  printf(\"%lld\\n\", (long long)({expr}));");
    }
    src.push_str("  return 0;\n}\n");
    src
}

/// Evaluates `exprs` against the header under `include`; returns one value per expression.
fn evaluate(include: &Path, exprs: &[&str], tag: usize) -> Vec<i64> {
    let dir = std::env::temp_dir().join(format!("hostfeed_ffi_layout_{}_{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c_file = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&c_file, probe_source(exprs)).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(cc)
        .arg("-I")
        .arg(include)
        .arg(&c_file)
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "compiling the layout probe against {} failed", include.display());
    let out = Command::new(&exe).output().expect("run the layout probe");
    std::fs::remove_dir_all(&dir).ok();
    let text = String::from_utf8(out.stdout).unwrap();
    let values: Vec<i64> = text.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(values.len(), exprs.len());
    values
}

#[test]
fn rust_mirror_matches_every_c_header() {
    let layouts = layout_table();
    let constants = constant_table();
    let minimums = minimum_table();
    let exact: Vec<(&str, i64)> = layouts
        .iter()
        .map(|&(e, v)| (e, i64::try_from(v).unwrap()))
        .chain(constants.iter().copied())
        .collect();
    let mut exprs: Vec<&str> = exact.iter().map(|(e, _)| *e).collect();
    exprs.extend(minimums.iter().map(|(e, _)| *e));
    let Some(dirs) = include_dirs() else {
        assert!(
            std::env::var_os("HOSTFEED_REQUIRE_FFI_HEADERS").is_none(),
            "HOSTFEED_REQUIRE_FFI_HEADERS is set but HOSTFEED_XLA_FFI_INCLUDE names no directory"
        );
        // Straight to stderr, past the test harness's capture, so that the skip is seen.
        let _ = std::io::stderr().write_all(
            b"ffi_layout: SKIPPED: the XLA FFI layout check needs jaxlib's headers; set \
              HOSTFEED_XLA_FFI_INCLUDE (e.g. to `python -c 'import jax; print(jax.ffi.include_dir())'`), \
              as the nox `rust` session does\n",
        );
        return;
    };
    let mut mismatches = Vec::new();
    for (tag, include) in dirs.iter().enumerate() {
        assert!(
            include.join("xla/ffi/api/c_api.h").exists(),
            "no xla/ffi/api/c_api.h under {}",
            include.display()
        );
        let values = evaluate(include, &exprs, tag);
        let include = include.display();
        for ((expr, rust), c) in exact.iter().zip(&values) {
            if c != rust {
                mismatches.push(format!("{include}: {expr}: C says {c}, Rust says {rust}"));
            }
        }
        for ((expr, rust), c) in minimums.iter().zip(&values[exact.len()..]) {
            if c < rust {
                mismatches.push(format!("{include}: {expr}: C says {c}, Rust needs at least {rust}"));
            }
        }
    }
    assert!(mismatches.is_empty(), "XLA FFI layout drift:\n{}", mismatches.join("\n"));
}
