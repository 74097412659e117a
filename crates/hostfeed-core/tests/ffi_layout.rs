//! Checks `rust/xla_ffi.rs` against the real `xla/ffi/api/c_api.h` shipped by jaxlib: a C
//! program compiled against the header prints every size, offset and enum value that the
//! Rust mirror declares; they must match exactly, except the few that a newer header may
//! only make larger (`minimum_table`: the API table's size, the API minor version).
//!
//! The headers are found through `HOSTFEED_XLA_FFI_INCLUDE` (one include directory, or
//! several separated like `PATH`, e.g. one per supported jaxlib, so one build is checked
//! against all of them) or, failing that, by asking the Python interpreter (`PYO3_PYTHON`
//! or `python3`) for `jax.ffi.include_dir()`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use _receiver::xla_ffi::{constant_table, layout_table, minimum_table};

fn include_dirs() -> Vec<PathBuf> {
    if let Some(dirs) = std::env::var_os("HOSTFEED_XLA_FFI_INCLUDE") {
        let dirs: Vec<PathBuf> = std::env::split_paths(&dirs).filter(|d| !d.as_os_str().is_empty()).collect();
        if !dirs.is_empty() {
            return dirs;
        }
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
    vec![PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())]
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
    let mut mismatches = Vec::new();
    for (tag, include) in include_dirs().iter().enumerate() {
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
