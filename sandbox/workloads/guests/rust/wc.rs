// The guest example in Rust: counts the lines, words and bytes of /input/input.txt, writes them to
// /output/summary.txt and prints one line (the same task and output as every language in
// docs/guests.md). Only std: it builds with Debian's rustc 1.63 and its wasm32-wasi std, no crates.
use std::fs;
use std::process::ExitCode;

fn main() -> ExitCode {
    let text = match fs::read("/input/input.txt") {
        Ok(t) => t,
        Err(e) => {
            eprintln!("/input/input.txt: {}", e);
            return ExitCode::from(1);
        }
    };
    let (mut lines, mut words, mut inword) = (0u64, 0u64, false);
    for &c in &text {
        if c == b'\n' {
            lines += 1;
        }
        if c == b' ' || (b'\t'..=b'\r').contains(&c) {
            inword = false;
        } else if !inword {
            inword = true;
            words += 1;
        }
    }
    let summary = format!("lines {}\nwords {}\nbytes {}\n", lines, words, text.len());
    if let Err(e) = fs::write("/output/summary.txt", summary) {
        eprintln!("/output/summary.txt: {}", e);
        return ExitCode::from(1);
    }
    println!("rust: {} lines, {} words, {} bytes", lines, words, text.len());
    ExitCode::SUCCESS
}
