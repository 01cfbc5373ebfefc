// Parsing a CloudEvents JSON envelope: one pass over its members with simdjson's on-demand
// parser, each attribute read and checked as it comes (envelope_attributes.cpp), `data` and
// extension values walked to their end (json_members.cpp), then what needs all of them.

#include <idem/storage/envelope.hpp>

#include "base64.hpp"
#include "envelope_attributes.hpp"
#include "json_members.hpp"

#include <cctype>
#include <vector>

namespace idem {

struct envelope_parser::impl {
    simdjson::ondemand::parser parser;
    std::string buffer;                   // input copy with simdjson's padding
    std::vector<std::string_view> names;  // member names of the objects being read, innermost last
};

envelope_parser::envelope_parser() : impl_(std::make_unique<impl>()) {}
envelope_parser::~envelope_parser() = default;
envelope_parser::envelope_parser(envelope_parser&&) noexcept = default;
envelope_parser& envelope_parser::operator=(envelope_parser&&) noexcept = default;

namespace {

using namespace detail;
using simdjson::ondemand::json_type;

// Bits of the attributes idem reads, to refuse one given twice.
enum attribute_bit : unsigned {
    bit_id = 1u << 0,
    bit_source = 1u << 1,
    bit_type = 1u << 2,
    bit_subject = 1u << 3,
    bit_time = 1u << 4,
    bit_msgid = 1u << 5,
    bit_specversion = 1u << 6,
    bit_sequence = 1u << 7,
    bit_data = 1u << 8,
    bit_data_base64 = 1u << 9,
    bit_datacontenttype = 1u << 10,
    bit_dataschema = 1u << 11,
};

}  // namespace

bool envelope_parser::parse(std::string_view text, envelope& out, parse_error& err) {
    // Reset field by field: a reused envelope keeps its strings' capacity.
    out.id.clear();
    out.source.clear();
    out.type.clear();
    out.subject.clear();
    out.sequence.reset();
    out.time.clear();
    out.msgid.clear();
    out.datacontenttype.clear();
    out.dataschema.clear();
    out.data.assign("null");
    out.data_binary = false;
    err.why = reason::none;
    err.detail.clear();
    // A UTF-8 byte order mark is not JSON (RFC 8259 section 8.1), but editors write one.
    if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);
    auto& buf = impl_->buffer;
    buf.assign(text);
    buf.append(simdjson::SIMDJSON_PADDING, '\0');
    auto& names = impl_->names;
    names.clear();

    simdjson::ondemand::document doc;
    if (auto e = impl_->parser.iterate(buf.data(), text.size(), buf.size()).get(doc); e != simdjson::SUCCESS) {
        if (e == simdjson::UTF8_ERROR) return fail(err, reason::invalid_utf8, "the body is not valid UTF-8");
        return fail(err, reason::invalid_json, "not a JSON document");
    }
    simdjson::ondemand::object object;
    if (doc.get_object().get(object) != simdjson::SUCCESS) {
        return fail(err, reason::invalid_json, "the body is not a single JSON object");
    }
    unsigned seen = 0;
    auto once = [&](unsigned bit, std::string_view name) {
        if ((seen & bit) != 0) {
            return fail(err, reason::invalid_field, "attribute '", name, "' appears twice");
        }
        seen |= bit;
        return true;
    };
    auto non_empty = [&](std::string_view name, std::string_view value) {
        return !value.empty() || fail(err, reason::invalid_field, "attribute '", name, "' must not be empty");
    };
    std::string_view specversion;
    std::string_view data_base64;
    for (auto field : object) {
        std::string_view name;
        if (field.unescaped_key().get(name) != simdjson::SUCCESS) {
            return fail(err, reason::invalid_json, "malformed attribute name");
        }
        simdjson::ondemand::value value;
        if (field.value().get(value) != simdjson::SUCCESS) {
            return fail(err, reason::invalid_json, "malformed value of attribute '", name, "'");
        }
        // The JSON format reads an attribute's null as unset (read_string notes it); `data` is
        // the payload, where null is a value.
        bool unset = false;
        bool ok = true;
        if (name == "id") {
            ok = once(bit_id, name) && read_string(value, name, out.id, unset, err);
        } else if (name == "source") {
            ok = once(bit_source, name) && read_string(value, name, out.source, unset, err);
        } else if (name == "type") {
            ok = once(bit_type, name) && read_string(value, name, out.type, unset, err);
        } else if (name == "subject") {
            ok = once(bit_subject, name) && read_string(value, name, out.subject, unset, err) &&
                 (unset || non_empty(name, out.subject));
        } else if (name == "time") {
            ok = once(bit_time, name) && read_string(value, name, out.time, unset, err);
            if (ok && !unset && !is_rfc3339_timestamp(out.time)) {
                return fail(err, reason::invalid_field,
                            "attribute 'time' is not an RFC 3339 timestamp (like 2026-12-02T10:00:00Z): \"", out.time,
                            "\"");
            }
        } else if (name == "msgid") {
            ok = once(bit_msgid, name) && read_string(value, name, out.msgid, unset, err);
        } else if (name == "specversion") {
            ok = once(bit_specversion, name) && read_string(value, name, specversion, unset, err);
        } else if (name == "sequence") {
            ok = once(bit_sequence, name) && read_sequence(value, out.sequence, err);
        } else if (name == "datacontenttype") {
            ok = once(bit_datacontenttype, name) && read_string(value, name, out.datacontenttype, unset, err) &&
                 (unset || non_empty(name, out.datacontenttype));
        } else if (name == "dataschema") {
            ok = once(bit_dataschema, name) && read_string(value, name, out.dataschema, unset, err) &&
                 (unset || non_empty(name, out.dataschema));
            const std::string_view dataschema = out.dataschema;
            // An absolute URI starts with its scheme: a letter, then letters, digits, '+', '-', '.', then ':'.
            const auto colon = dataschema.find(':');
            if (ok && !unset &&
                (colon == std::string_view::npos || colon == 0 || !std::isalpha(static_cast<unsigned char>(dataschema[0])) ||
                 dataschema.substr(0, colon).find_first_not_of(
                     "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.") != std::string_view::npos)) {
                return fail(err, reason::invalid_field, "attribute 'dataschema' must be an absolute URI, got \"",
                            dataschema, "\"");
            }
        } else if (name == "data_base64") {
            // A member of the JSON format, not an attribute, so the naming rule does not apply to it.
            ok = once(bit_data_base64, name);
            if (ok && value.get_string().get(data_base64) != simdjson::SUCCESS) {
                data_base64 = {};
                json_type type{};
                if (value.type().get(type) != simdjson::SUCCESS || type != json_type::null ||
                    trim_right(value.raw_json_token()) != "null") {
                    return fail(err, reason::invalid_field, "attribute 'data_base64' must be a base64 string");
                }
            }
        } else if (name == "data") {
            ok = once(bit_data, name);
            json_type type{};
            if (ok && value.type().get(type) != simdjson::SUCCESS) {
                return fail(err, reason::invalid_json, "attribute 'data' is not valid JSON");
            }
            if (ok) {
                // A scalar is its token; an object or array runs from its first token to the one after it.
                const auto token = value.raw_json_token();
                const char* end = token.data() + token.size();
                json_finding found;
                const auto fault = validate(value, names, found);
                if (fault == json_fault::repeated_name) {
                    return fail_repeated_member(err, found);
                }
                if (fault == json_fault::too_deep) {
                    return fail(err, reason::invalid_json,
                                "attribute 'data' is nested deeper than " + std::to_string(max_json_depth) + " levels");
                }
                if (fault != json_fault::none || ((type == json_type::object || type == json_type::array) &&
                                                  doc.current_location().get(end) != simdjson::SUCCESS)) {
                    return fail(err, reason::invalid_json, "attribute 'data' is not valid JSON");
                }
                out.data.assign(trim_right(std::string_view(token.data(), static_cast<std::size_t>(end - token.data()))));
            }
        } else {
            // An extension: idem ignores its value, but it must follow the CloudEvents rules.
            if (!is_attribute_name(name)) {
                return fail(err, reason::invalid_field, "extension attribute name '", name,
                            "' is not made of lower-case letters a-z and digits 0-9");
            }
            json_type type{};
            if (value.type().get(type) != simdjson::SUCCESS) {
                return fail(err, reason::invalid_json, "malformed value of attribute '", name, "'");
            }
            unset = type == json_type::null;
            if (unset && trim_right(value.raw_json_token()) != "null") {
                return fail(err, reason::invalid_json, "malformed value of attribute '", name, "'");
            }
            if (type == json_type::object || type == json_type::array) {
                json_finding found;
                const auto fault = validate(value, names, found);
                if (fault == json_fault::malformed) {
                    return fail(err, reason::invalid_json, "malformed value of attribute '", name, "'");
                }
                if (fault == json_fault::too_deep) {
                    return fail(err, reason::invalid_json, "the value of attribute '", name,
                                "' is nested deeper than " + std::to_string(max_json_depth) + " levels");
                }
            }
            ok = unset || check_extension(value, type, name, err);
            names.push_back(name);
        }
        if (!ok) {
            return false;
        }
    }
    if (doc.current_location().error() != simdjson::OUT_OF_BOUNDS) {
        return fail(err, reason::invalid_json, "trailing content after the event object");
    }
    if (const auto repeated = find_repeated(names, 0)) {
        return fail(err, reason::invalid_field, "attribute '", *repeated, "' appears twice");
    }
    if (specversion.data() != nullptr && specversion != "1.0") {
        return fail(err, reason::unsupported_specversion, "specversion \"", specversion,
                    "\" is not supported (only \"1.0\")");
    }
    if (out.id.empty()) return fail(err, reason::missing_id, "attribute 'id' is missing or empty");
    if (out.source.empty()) return fail(err, reason::missing_source, "attribute 'source' is missing or empty");
    if (out.type.empty()) return fail(err, reason::missing_type, "attribute 'type' is missing or empty");
    if (specversion.data() == nullptr) {
        return fail(err, reason::missing_specversion,
                    "attribute 'specversion' is missing (CloudEvents 1.0 requires \"specversion\":\"1.0\")");
    }
    if (out.sequence && out.subject.empty()) {
        return fail(err, reason::invalid_sequence, "attribute 'sequence' needs a 'subject' (the stream it counts)");
    }
    const bool binary = data_base64.data() != nullptr;  // present and not null
    if (binary && (seen & bit_data) != 0) {
        return fail(err, reason::invalid_field,
                    "members 'data' and 'data_base64' are mutually exclusive (the payload is one or the other)");
    }
    if (binary) {
        // Decoded here, after the loop: datacontenttype may come after data_base64, and the
        // document (whose buffer data_base64 points into) is not read again.
        if (!decode_base64(data_base64, out.data)) {
            return fail(err, reason::invalid_field, "attribute 'data_base64' is not valid base64 (RFC 4648)");
        }
        out.data_binary = !is_json_media_type(out.datacontenttype) ||
                          !is_json_data(impl_->parser, impl_->buffer, out.data, names);
        if (!out.data_binary) {
            // As `data` would be kept: the value's own text, without the whitespace around it.
            out.data.resize(trim_right(out.data).size());
            out.data.erase(0, out.data.find_first_not_of(" \t\r\n"));
        }
    }
    return true;
}

}  // namespace idem
