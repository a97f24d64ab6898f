// The guest example in C++: counts the lines, words and bytes of /input/input.txt, writes them to
// /output/summary.txt and prints one line (the same task and output as every language in
// docs/guests.md). Built with -fno-exceptions: Debian's wasm32 libc++ has no exception support.
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

int main() {
    std::ifstream in("/input/input.txt", std::ios::binary);
    if (!in) {
        std::cerr << "/input/input.txt: cannot open\n";
        return 1;
    }
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    unsigned long long lines = 0, words = 0;
    bool inword = false;
    for (unsigned char c : text) {
        if (c == '\n') ++lines;
        bool space = c == ' ' || (c >= '\t' && c <= '\r');
        if (space) inword = false;
        else if (!inword) { inword = true; ++words; }
    }
    std::ofstream out("/output/summary.txt", std::ios::binary);
    out << "lines " << lines << "\nwords " << words << "\nbytes " << text.size() << "\n";
    out.close();
    if (!out) {
        std::cerr << "/output/summary.txt: cannot write\n";
        return 1;
    }
    std::cout << "cpp: " << lines << " lines, " << words << " words, " << text.size() << " bytes\n";
    return 0;
}
