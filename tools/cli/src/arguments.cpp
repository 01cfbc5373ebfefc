#include <idem/cli/tool.hpp>

#include "command_line.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <system_error>

namespace idem::cli {

arguments::arguments(std::string command, std::multimap<std::string, std::string, std::less<>> values)
    : command_(std::move(command)), values_(std::move(values)) {}

arguments::arguments(std::string command, const std::vector<option>& known, const std::vector<std::string>& argv) {
    const std::vector<cli::command> one{{command, "", known, {}}};
    std::vector<std::string> words{command};
    words.insert(words.end(), argv.begin(), argv.end());
    auto parsed = detail::command_line{command, one}.parse(words);
    if (!parsed.error.empty()) throw usage_error(parsed.error);
    *this = std::move(parsed.args);
}

std::optional<std::string> arguments::get(std::string_view name) const {
    auto it = values_.find(name);
    if (it == values_.end()) return std::nullopt;
    return it->second;
}

const std::string& arguments::required(std::string_view name) const {
    auto it = values_.find(name);
    if (it == values_.end()) throw usage_error("missing option '--" + std::string(name) + "'");
    return it->second;
}

std::vector<std::string> arguments::all(std::string_view name) const {
    std::vector<std::string> out;
    auto [first, last] = values_.equal_range(name);
    for (auto it = first; it != last; ++it) out.push_back(it->second);
    return out;
}

bool arguments::flag(std::string_view name) const { return values_.find(name) != values_.end(); }

std::uint64_t arguments::number(std::string_view name, std::uint64_t fallback) const {
    auto v = get(name);
    if (!v) return fallback;
    std::string text;
    for (char c : *v) {
        if (c != '_' && c != ',') text.push_back(c);
    }
    double scale = 1;
    if (!text.empty()) {
        switch (text.back()) {
        case 'k': case 'K': scale = 1e3; text.pop_back(); break;
        case 'm': case 'M': scale = 1e6; text.pop_back(); break;
        case 'g': case 'G': scale = 1e9; text.pop_back(); break;
        default: break;
        }
    }
    errno = 0;
    char* end = nullptr;
    double d = std::strtod(text.c_str(), &end);
    d *= scale;
    if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !(d >= 0) || d > 1.8e19 ||
        d != std::floor(d)) {
        throw usage_error("option '--" + std::string(name) + "': '" + *v + "' is not a non-negative whole number");
    }
    return static_cast<std::uint64_t>(d);
}

std::uint64_t arguments::positive(std::string_view name, std::uint64_t fallback) const {
    const auto n = number(name, fallback);
    if (n == 0) throw usage_error("option '--" + std::string(name) + "': must be at least 1");
    return n;
}

double arguments::real(std::string_view name, double fallback) const {
    auto v = get(name);
    if (!v) return fallback;
    errno = 0;
    char* end = nullptr;
    double d = std::strtod(v->c_str(), &end);
    if (v->empty() || end != v->c_str() + v->size() || errno != 0 || !std::isfinite(d)) {
        throw usage_error("option '--" + std::string(name) + "': '" + *v + "' is not a number");
    }
    return d;
}

output::output() { buffer_.reserve(1 << 20); }

output::~output() {
    try {
        flush();
    } catch (...) {  // NOLINT: a destructor must not throw; run() flushes explicitly first
    }
}

void output::write(std::string_view text) {
    buffer_.append(text);
    if (buffer_.size() >= (1u << 20)) flush();
}

void output::flush() {
    std::size_t done = 0;
    while (done < buffer_.size()) {
        auto n = ::write(STDOUT_FILENO, buffer_.data() + done, buffer_.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            auto e = errno;
            buffer_.clear();
            throw std::system_error(e, std::system_category(), "cannot write to standard output");
        }
        done += static_cast<std::size_t>(n);
    }
    buffer_.clear();
}

}  // namespace idem::cli
