// Read one float64 array from a relpos-ref golden file (safetensors), no dependencies.
// Build: g++ -std=c++17 -O2 read_golden.cpp -o read_golden
// Run:   ./read_golden golden/<case>.safetensors output
// Prints the shape, then every value (C order), one per line, to full precision.
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
    if (entry.find("\"F64\"") == std::string::npos) {
        std::fprintf(stderr, "%s is not float64 (goldens are)\n", argv[2]);
        return 1;
    }
    std::vector<long long> shape = numbers_after(entry, "shape");
    std::vector<long long> offsets = numbers_after(entry, "data_offsets");
    size_t count = static_cast<size_t>((offsets[1] - offsets[0]) / 8);
    std::vector<double> values(count);  // safetensors data are little-endian, as on x86 and ARM
    file.seekg(static_cast<std::streamoff>(8 + header_size + offsets[0]));
    file.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(count * 8));

    std::printf("shape");
    for (long long n : shape) std::printf(" %lld", n);
    std::printf("\n");
    for (double x : values) std::printf("%.17g\n", x);
    return 0;
}
