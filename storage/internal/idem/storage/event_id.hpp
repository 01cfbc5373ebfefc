#pragma once

// The event id's text (envelope::event_id), appended to a buffer the caller keeps: the
// writer stages event ids by the batch without a string of their own per event. Not installed.

#include <string>
#include <string_view>

namespace idem {

/// Appends the event id of (source, id) to out: exactly what envelope::event_id() returns.
void append_event_id(std::string& out, std::string_view source, std::string_view id);

}  // namespace idem
