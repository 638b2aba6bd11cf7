// Read one floating array from a relpos-ref golden file (safetensors), std only:
// a float64 golden (output, dq, d_key_table, ...) or an input in the dtype under test
// (q, k, v, tables, d_output) in float64, float32, float16 or bfloat16.
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

fn half_to_f64(h: u16) -> f64 {
    // IEEE float16: sign, 5 exponent bits, 10 mantissa bits.
    let exponent = ((h >> 10) & 0x1f) as i32;
    let mantissa = (h & 0x3ff) as f64;
    let magnitude = match exponent {
        0 => mantissa * 2f64.powi(-24),
        31 => if mantissa == 0.0 { f64::INFINITY } else { f64::NAN },
        _ => (mantissa + 1024.0) * 2f64.powi(exponent - 25),
    };
    if h & 0x8000 != 0 { -magnitude } else { magnitude }
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
    let dtype = ["F64", "F32", "F16", "BF16"]
        .into_iter()
        .find(|d| entry.contains(&format!("\"{d}\"")))
        .unwrap_or_else(|| {
            eprintln!("{} is not a floating array (F64, F32, F16 or BF16)", args[2]);
            std::process::exit(1);
        });
    let width = match dtype { "F64" => 8, "F32" => 4, _ => 2 };
    let shape = numbers_after(entry, "shape");
    let offsets = numbers_after(entry, "data_offsets");
    let start = 8 + header_size + offsets[0] as usize;
    let data = &bytes[start..8 + header_size + offsets[1] as usize];
    let values: Vec<f64> = data  // little-endian
        .chunks_exact(width)
        .map(|b| match dtype {
            "F64" => f64::from_le_bytes(b.try_into().unwrap()),
            "F32" => f32::from_le_bytes(b.try_into().unwrap()) as f64,
            "BF16" => f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16) as f64,
            _ => half_to_f64(u16::from_le_bytes([b[0], b[1]])),
        })
        .collect();
    let shape_text: Vec<String> = shape.iter().map(|n| n.to_string()).collect();
    println!("shape {}", shape_text.join(" "));
    for x in values {
        println!("{:e}", x);
    }
}
