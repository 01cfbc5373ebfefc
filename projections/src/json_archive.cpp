#include <idem/projections/json_archive.hpp>

#include <simdjson.h>

#include <charconv>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace idem {

namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

std::string describe(element v) {
    switch (v.type()) {
        case element_type::ARRAY:
            return "an array";
        case element_type::OBJECT:
            return "an object";
        case element_type::INT64:
            return std::to_string(v.get_int64().value_unsafe());
        case element_type::UINT64:
            return std::to_string(v.get_uint64().value_unsafe());
        case element_type::DOUBLE: {
            char buf[64];
            const auto r = std::to_chars(buf, buf + sizeof buf, v.get_double().value_unsafe());
            std::string text(buf, r.ptr);
            // Shortest form prints 2.0 as "2"; keep it visibly a fraction-typed number.
            if (text.find_first_of(".en") == std::string::npos) text += ".0";
            return text;
        }
        case element_type::STRING: {
            const std::string_view s = v.get_string().value_unsafe();
            constexpr std::size_t shown = 40;
            return "\"" + std::string(s.substr(0, shown)) + (s.size() > shown ? "...\"" : "\"");
        }
        case element_type::BOOL:
            return v.get_bool().value_unsafe() ? "true" : "false";
        case element_type::NULL_VALUE:
            return "null";
    }
    return "a value";
}

// Parses all of text as an integer (cereal writes long long as a string).
template <class T>
bool parse_whole(std::string_view text, T& out) {
    const char* end = text.data() + text.size();
    const auto r = std::from_chars(text.data(), end, out);
    return r.ec == std::errc{} && r.ptr == end && !text.empty();
}

std::string range_text(std::int64_t min, std::uint64_t max) {
    return "expected an integer from " + std::to_string(min) + " to " + std::to_string(max);
}

}  // namespace

struct json_input_archive::state {
    // One entered node: an object walked member by member, or an array walked item by item.
    struct frame {
        bool object = false;
        simdjson::dom::object::iterator member_begin, member, member_end;
        simdjson::dom::array::iterator item, item_end;
        simdjson::dom::element node;
        std::size_t index = 0;  // position of the next value
        // Where the node sits in its parent, for the paths in error messages.
        std::string_view key;
        std::size_t position = 0;
        bool in_array = false;
    };

    simdjson::dom::parser parser;
    std::vector<frame> frames;
    bool busy = false;
    bool heap = false;

    // The next value's label in its node: the requested name, else the key or index at the position.
    std::string label(const char* name) const {
        if (name != nullptr) return name;
        const frame& f = frames.back();
        if (!f.object) return "[" + std::to_string(f.index) + "]";
        if (f.member != f.member_end) return std::string(f.member.key());
        return "#" + std::to_string(f.index);
    }

    // The path of the innermost node ("legs[2]"), with field appended when given.
    std::string path(const std::string* field) const {
        std::string out;
        for (std::size_t i = 1; i < frames.size(); ++i) {
            const frame& f = frames[i];
            if (f.in_array) {
                out += "[" + std::to_string(f.position) + "]";
            } else {
                if (!out.empty()) out += '.';
                out += f.key;
            }
        }
        if (field != nullptr) {
            if (!out.empty() && field->front() != '[') out += '.';
            out += *field;
        }
        return out;
    }

    [[noreturn]] void fail_at(std::string where, const std::string& cause) const {
        if (where.empty()) throw cereal::Exception("payload: " + cause);
        throw cereal::Exception("field '" + where + "': " + cause);
    }
    [[noreturn]] void fail(const char* name, const std::string& cause) const {
        const std::string field = label(name);
        fail_at(path(&field), cause);
    }
    [[noreturn]] void fail_node(const std::string& cause) const { fail_at(path(nullptr), cause); }

    // Positions the innermost node at the next value, found as cereal::JSONInputArchive
    // finds it: the current member if its name matches, else the first member so named.
    bool try_locate(const char* name, element& out) {
        frame& f = frames.back();
        if (f.object) {
            if (name != nullptr) {
                const std::string_view want{name};
                if (f.member == f.member_end || f.member.key() != want) {
                    auto it = f.member_begin;
                    std::size_t i = 0;
                    while (it != f.member_end && it.key() != want) {
                        ++it;
                        ++i;
                    }
                    if (it == f.member_end) return false;
                    f.member = it;
                    f.index = i;
                }
            } else if (f.member == f.member_end) {
                return false;
            }
            out = f.member.value();
            return true;
        }
        if (name != nullptr || f.item == f.item_end) return false;
        out = *f.item;
        return true;
    }

    element locate(const char* name) {
        element v;
        if (!try_locate(name, v)) {
            if (name != nullptr) {
                fail(name, frames.back().object ? "not found" : "not found (the enclosing value is an array)");
            }
            fail_node("no value left to read at position " + std::to_string(frames.back().index));
        }
        return v;
    }

    void advance() {
        frame& f = frames.back();
        if (f.object) {
            ++f.member;
        } else {
            ++f.item;
        }
        ++f.index;
    }

    // Enters v, the value at the innermost node's position.
    void enter(element v, const char* name) {
        frame child;
        const frame& parent = frames.back();
        if (parent.object) {
            child.key = parent.member.key();
        } else {
            child.in_array = true;
            child.position = parent.index;
        }
        child.node = v;
        if (v.type() == element_type::OBJECT) {
            const auto o = v.get_object().value_unsafe();
            child.object = true;
            child.member_begin = child.member = o.begin();
            child.member_end = o.end();
        } else if (v.type() == element_type::ARRAY) {
            const auto a = v.get_array().value_unsafe();
            child.item = a.begin();
            child.item_end = a.end();
        } else {
            fail(name, "expected an object or an array, got " + describe(v));
        }
        frames.push_back(child);
    }
};

namespace {

void release(json_input_archive::state*& s) noexcept {
    if (s == nullptr) return;
    if (s->heap) {
        delete s;
    } else {
        s->busy = false;
    }
    s = nullptr;
}

}  // namespace

json_input_archive::json_input_archive(std::string_view json) : InputArchive<json_input_archive>(this) {
    // One parser per thread keeps its buffers between payloads; an archive opened while
    // another is alive on the same thread (a nested decode) gets its own.
    thread_local state local;
    if (local.busy) {
        state_ = new state;
        state_->heap = true;
    } else {
        state_ = &local;
    }
    state_->busy = true;
    state_->frames.clear();
    try {
        element root;
        if (const auto error = state_->parser.parse(json.data(), json.size()).get(root); error != simdjson::SUCCESS) {
            throw cereal::Exception(std::string("payload is not valid JSON: ") + simdjson::error_message(error));
        }
        state::frame top;
        top.node = root;
        if (root.type() == element_type::OBJECT) {
            const auto o = root.get_object().value_unsafe();
            top.object = true;
            top.member_begin = top.member = o.begin();
            top.member_end = o.end();
        } else if (root.type() == element_type::ARRAY) {
            const auto a = root.get_array().value_unsafe();
            top.item = a.begin();
            top.item_end = a.end();
        } else {
            throw cereal::Exception("payload: expected an object or an array, got " + describe(root));
        }
        state_->frames.push_back(top);
    } catch (...) {
        release(state_);
        throw;
    }
}

json_input_archive::~json_input_archive() {
    release(state_);
}

void json_input_archive::start_node() {
    state& s = *state_;
    const char* name = std::exchange(next_name_, nullptr);
    s.enter(s.locate(name), name);
}

void json_input_archive::finish_node() {
    state& s = *state_;
    if (s.frames.size() < 2) throw cereal::Exception("payload: finish_node() without a matching start_node()");
    s.frames.pop_back();
    s.advance();
}

std::size_t json_input_archive::node_size() {
    const state& s = *state_;
    const auto& f = s.frames.back();
    if (f.object) s.fail_node("expected an array, got an object");
    const auto a = f.node.get_array().value_unsafe();
    std::size_t n = a.size();
    if (n == 0xFFFFFF) {  // simdjson saturates the stored count
        n = 0;
        for (auto it = a.begin(); it != a.end(); ++it) ++n;
    }
    return n;
}

bool json_input_archive::node_is_object() const noexcept {
    return state_->frames.back().object;
}

bool json_input_archive::next_key(std::string_view& key) const noexcept {
    const auto& f = state_->frames.back();
    if (!f.object || f.member == f.member_end) return false;
    key = f.member.key();
    return true;
}

bool json_input_archive::read_bool() {
    state& s = *state_;
    const char* name = std::exchange(next_name_, nullptr);
    const element v = s.locate(name);
    if (v.type() != element_type::BOOL) s.fail(name, "expected a boolean, got " + describe(v));
    s.advance();
    return v.get_bool().value_unsafe();
}

std::int64_t json_input_archive::read_int(std::int64_t min, std::int64_t max, bool text_ok) {
    state& s = *state_;
    const char* name = std::exchange(next_name_, nullptr);
    const element v = s.locate(name);
    std::int64_t n = 0;
    switch (v.type()) {
        case element_type::INT64:
            n = v.get_int64().value_unsafe();
            break;
        case element_type::UINT64:
            s.fail(name, range_text(min, static_cast<std::uint64_t>(max)) + ", got " + describe(v));
        case element_type::STRING:
            if (text_ok && parse_whole(v.get_string().value_unsafe(), n)) break;
            [[fallthrough]];
        default:
            s.fail(name, "expected an integer, got " + describe(v));
    }
    if (n < min || n > max) s.fail(name, range_text(min, static_cast<std::uint64_t>(max)) + ", got " + describe(v));
    s.advance();
    return n;
}

std::uint64_t json_input_archive::read_uint(std::uint64_t max, bool text_ok) {
    state& s = *state_;
    const char* name = std::exchange(next_name_, nullptr);
    const element v = s.locate(name);
    std::uint64_t n = 0;
    switch (v.type()) {
        case element_type::INT64: {
            const std::int64_t i = v.get_int64().value_unsafe();
            if (i < 0) s.fail(name, range_text(0, max) + ", got " + describe(v));
            n = static_cast<std::uint64_t>(i);
            break;
        }
        case element_type::UINT64:
            n = v.get_uint64().value_unsafe();
            break;
        case element_type::STRING:
            if (text_ok && parse_whole(v.get_string().value_unsafe(), n)) break;
            [[fallthrough]];
        default:
            s.fail(name, "expected an integer, got " + describe(v));
    }
    if (n > max) s.fail(name, range_text(0, max) + ", got " + describe(v));
    s.advance();
    return n;
}

double json_input_archive::read_double() {
    state& s = *state_;
    const char* name = std::exchange(next_name_, nullptr);
    const element v = s.locate(name);
    double d = 0;
    if (v.get_double().get(d) != simdjson::SUCCESS) s.fail(name, "expected a number, got " + describe(v));
    s.advance();
    return d;
}

long double json_input_archive::read_long_double() {
    state& s = *state_;
    const char* name = std::exchange(next_name_, nullptr);
    const element v = s.locate(name);
    long double d = 0;
    if (v.type() == element_type::STRING) {
        const std::string text(v.get_string().value_unsafe());
        char* end = nullptr;
        d = std::strtold(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size()) {
            s.fail(name, "expected a number, got " + describe(v));
        }
    } else {
        double n = 0;
        if (v.get_double().get(n) != simdjson::SUCCESS) s.fail(name, "expected a number, got " + describe(v));
        d = n;
    }
    s.advance();
    return d;
}

std::string_view json_input_archive::read_string() {
    state& s = *state_;
    const char* name = std::exchange(next_name_, nullptr);
    const element v = s.locate(name);
    if (v.type() != element_type::STRING) s.fail(name, "expected a string, got " + describe(v));
    s.advance();
    return v.get_string().value_unsafe();
}

void json_input_archive::read_null() {
    state& s = *state_;
    const char* name = std::exchange(next_name_, nullptr);
    const element v = s.locate(name);
    if (v.type() != element_type::NULL_VALUE) s.fail(name, "expected null, got " + describe(v));
    s.advance();
}

json_input_archive::optional_form json_input_archive::next_optional() {
    state& s = *state_;
    const char* name = std::exchange(next_name_, nullptr);
    element v;
    if (!s.try_locate(name, v)) return optional_form::empty;
    if (v.type() == element_type::NULL_VALUE) {
        s.advance();
        return optional_form::empty;
    }
    if (v.type() == element_type::OBJECT) {
        // cereal's own encoding: {"nullopt":true} or {"nullopt":false,"data":v}.
        std::size_t members = 0;
        bool flagged = false;
        bool nullopt = false;
        bool wrapped = true;
        const simdjson::dom::object object = v.get_object().value_unsafe();
        for (const auto member : object) {
            ++members;
            if (member.key == "nullopt" && member.value.get_bool().get(nullopt) == simdjson::SUCCESS) {
                flagged = true;
            } else if (member.key != "data") {
                wrapped = false;
            }
        }
        if (wrapped && flagged && members == (nullopt ? 1U : 2U)) {
            if (nullopt) {
                s.advance();
                return optional_form::empty;
            }
            s.enter(v, name);
            return optional_form::wrapped;
        }
    }
    return optional_form::value;
}

}  // namespace idem
