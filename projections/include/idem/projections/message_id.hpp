#pragma once

// The inbox keys of message ids: a transport id within its transport, or an event id.

#include <string>
#include <string_view>
#include <utility>

namespace idem {

/// Returns the inbox key of a transport id within its transport: "m<id>" for the unnamed transport,
/// else "t<len(transport)>:<transport><id>" (length-prefixed: no two (transport, id) pairs alias, and
/// neither aliases an event id's "e..." key).
std::string transport_message_id(std::string_view transport, std::string_view transport_id);
/// Splits an inbox key into (transport, id): "t<n>:<transport><id>", "m<id>" (transport "") or
/// "e<event id>" (transport "", id the event id).
std::pair<std::string_view, std::string_view> split_message_id(std::string_view key);

}  // namespace idem
