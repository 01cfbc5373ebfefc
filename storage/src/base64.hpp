#pragma once

// RFC 4648 base64 (standard alphabet): to_json writes binary data with it, the envelope
// parser reads data_base64 (base64.cpp).

#include <string>
#include <string_view>

namespace idem::detail {

/// Appends bytes in base64, padded.
void append_base64(std::string& out, std::string_view bytes);
/// Decodes in into out; false if in is not base64 (padding may be left out; any other
/// character, whitespace included, is an error).
bool decode_base64(std::string_view in, std::string& out);

}  // namespace idem::detail
