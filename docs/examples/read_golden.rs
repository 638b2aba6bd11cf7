// Read one float64 array from a relpos-ref golden file (safetensors), std only.
// Build: rustc --edition 2021 -O read_golden.rs
// Run:   ./read_golden golden/<case>.safetensors output
// Prints the shape, then every value (C order), one per line.
use std::env;
use std::fs;

fn numbers_after(entry: &str, key: &str) -> Vec<u64> {
    let at = entry.find(&format!("\"{key}\"")).expect("key in the tensor entry");
    let open = at + entry[at..].find('[').unwrap();
    let close = open + entry[open..].find(']').unwrap();
    entry[open + 1..close]
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect()
}

fn main() {
    let args: Vec<String> = env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: {} FILE.safetensors ARRAY", args[0]);
        std::process::exit(2);
    }
    let bytes = fs::read(&args[1]).expect("readable file");
    let header_size = u64::from_le_bytes(bytes[0..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + header_size]).expect("utf-8 header");
    let at = header
        .find(&format!("\"{}\":{{", args[2]))
        .unwrap_or_else(|| panic!("no array {}", args[2]));
    let entry = &header[at..at + header[at..].find('}').unwrap()];
    assert!(entry.contains("\"F64\""), "goldens are float64");
    let shape = numbers_after(entry, "shape");
    let offsets = numbers_after(entry, "data_offsets");
    let data = &bytes[8 + header_size + offsets[0] as usize..8 + header_size + offsets[1] as usize];
    let shape_text: Vec<String> = shape.iter().map(|n| n.to_string()).collect();
    println!("shape {}", shape_text.join(" "));
    for chunk in data.chunks_exact(8) {
        println!("{:e}", f64::from_le_bytes(chunk.try_into().unwrap()));
    }
}
