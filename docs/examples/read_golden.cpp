// Read one floating array from a relpos-ref golden file (safetensors), no dependencies:
// a float64 golden (output, dq, d_key_table, ...) or an input in the dtype under test
// (q, k, v, tables, d_output) in float64, float32, float16 or bfloat16.
// Build: g++ -std=c++17 -O2 read_golden.cpp -o read_golden
// Run:   ./read_golden golden/<case>.safetensors output
// Prints the shape, then every value (C order), one per line, to full precision.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

static std::vector<long long> numbers_after(const std::string& entry, const std::string& key) {
    // The JSON list that follows "key": [a, b, ...] inside one tensor entry.
    std::vector<long long> out;
    size_t at = entry.find("\"" + key + "\"");
    if (at == std::string::npos) return out;
    size_t open = entry.find('[', at), close = entry.find(']', open);
    std::string list = entry.substr(open + 1, close - open - 1);
    for (size_t i = 0; i < list.size();) {
        size_t used = 0;
        if (list.find_first_of("0123456789", i) == std::string::npos) break;
        i = list.find_first_of("0123456789", i);
        out.push_back(std::stoll(list.substr(i), &used));
        i += used;
    }
    return out;
}

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s FILE.safetensors ARRAY\n", argv[0]);
        return 2;
    }
    std::ifstream file(argv[1], std::ios::binary);
    if (!file) { std::fprintf(stderr, "cannot open %s\n", argv[1]); return 1; }
    unsigned char size_bytes[8];
    file.read(reinterpret_cast<char*>(size_bytes), 8);
    uint64_t header_size = 0;  // little-endian u64
    for (int b = 7; b >= 0; --b) header_size = (header_size << 8) | size_bytes[b];
    std::string header(header_size, '\0');
    file.read(&header[0], static_cast<std::streamsize>(header_size));

    size_t at = header.find("\"" + std::string(argv[2]) + "\":{");
    if (at == std::string::npos) { std::fprintf(stderr, "no array %s\n", argv[2]); return 1; }
    std::string entry = header.substr(at, header.find('}', at) - at);
    // Goldens are F64; inputs and d_output are in the dtype under test (F64, F32, F16, BF16).
    size_t width = 0;
    std::string dtype;
    for (const char* name : {"F64", "F32", "F16", "BF16"}) {
        if (entry.find("\"" + std::string(name) + "\"") != std::string::npos) dtype = name;
    }
    if (dtype.empty()) {
        std::fprintf(stderr, "%s is not a floating array (F64, F32, F16 or BF16)\n", argv[2]);
        return 1;
    }
    width = dtype == "F64" ? 8 : dtype == "F32" ? 4 : 2;
    std::vector<long long> shape = numbers_after(entry, "shape");
    std::vector<long long> offsets = numbers_after(entry, "data_offsets");
    size_t count =
        static_cast<size_t>((offsets[1] - offsets[0]) / static_cast<long long>(width));
    std::vector<unsigned char> raw(count * width);  // little-endian, as on x86 and ARM
    file.seekg(static_cast<std::streamoff>(8 + header_size + offsets[0]));
    file.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size()));
    std::vector<double> values(count);
    for (size_t n = 0; n < count; ++n) {
        const unsigned char* b = raw.data() + n * width;
        if (dtype == "F64") {
            std::memcpy(&values[n], b, 8);
        } else if (dtype == "F32") {
            float f;
            std::memcpy(&f, b, 4);
            values[n] = f;
        } else if (dtype == "BF16") {  // the upper half of a float32
            uint32_t bits = static_cast<uint32_t>(b[0] | (b[1] << 8)) << 16;
            float f;
            std::memcpy(&f, &bits, 4);
            values[n] = f;
        } else {  // F16: sign, 5 exponent bits, 10 mantissa bits
            unsigned h = static_cast<unsigned>(b[0] | (b[1] << 8));
            int exponent = static_cast<int>((h >> 10) & 0x1f);
            double mantissa = static_cast<double>(h & 0x3ff);
            double magnitude = exponent == 0 ? std::ldexp(mantissa, -24)
                : exponent == 31 ? (mantissa == 0 ? HUGE_VAL : NAN)
                : std::ldexp(mantissa + 1024.0, exponent - 25);
            values[n] = (h & 0x8000) ? -magnitude : magnitude;
        }
    }

    std::printf("shape");
    for (long long n : shape) std::printf(" %lld", n);
    std::printf("\n");
    for (double x : values) std::printf("%.17g\n", x);
    return 0;
}
