// The writer-independent half of apply(): envelope parsing, the size limit, payload decoding,
// key and effect-key functions. Runs on any thread (store::prepare is const).

#include "store_internal.hpp"

#include <idem/storage/canonical.hpp>
#include <idem/storage/codec.hpp>
#include <idem/storage/crash_point.hpp>
#include <idem/storage/duration.hpp>
#include <idem/storage/envelope_record.hpp>
#include <idem/storage/event_id.hpp>
#include <idem/storage/reused_buffer.hpp>

#include <algorithm>
#include <iterator>

namespace idem {

prepared_batch::prepared_batch() = default;
prepared_batch::~prepared_batch() = default;
prepared_batch::prepared_batch(prepared_batch&&) noexcept = default;
prepared_batch& prepared_batch::operator=(prepared_batch&&) noexcept = default;
std::size_t prepared_batch::size() const noexcept { return items_.size(); }
void prepared_batch::append(prepared_batch&& other) {
    if (items_.empty() && items_.capacity() < other.items_.size()) {
        items_.swap(other.items_);
        return;
    }
    std::move(other.items_.begin(), other.items_.end(), std::back_inserter(items_));
    other.items_.clear();
}
void prepared_batch::take(prepared_batch& other, std::size_t i) { items_.push_back(std::move(other.items_.at(i))); }
void prepared_batch::clear() noexcept { items_.clear(); }
void prepared_batch::reserve(std::size_t n) { items_.reserve(n); }

namespace detail {

/// Decodes the event for every projection handling its type and runs the key functions.
void prepare_parts(const store::impl& s, const envelope& ev, std::vector<part>& parts) {
    meta m{ev.id, ev.source, ev.type, ev.subject, ev.sequence, ev.time, {}};
    std::string event_id;  // the default effect key, built when a projection needs it
    std::size_t used = 0;  // parts are reused (with their strings' capacity) when a batch is recycled
    // Old versions are lifted first: the handlers are those of the type the steps lead to, and
    // they decode the lifted data (binary data is not JSON: no step reads it).
    auto lifted = s.upcasts.lift(ev);
    const std::string_view type = lifted.type.empty() ? std::string_view(ev.type) : lifted.type;
    for (std::size_t p = 0; p < s.projections.size(); ++p) {
        const auto& proj = *s.projections[p];
        const auto* h = proj.find(type);
        if (h == nullptr) continue;
        if (used == parts.size()) parts.emplace_back();
        auto& out = parts[used++];
        out.projection = p;
        out.handler = h;
        out.decoded.reset();
        out.keys.clear();
        out.effect.reset();
        out.failed = reason::none;
        out.detail.clear();
        auto fail = [&](reason why, const std::string& what) {
            out.failed = why;
            out.detail = describe(ev) + ", projection '" + proj.name() + "'" + what;
        };
        if (ev.data_binary) {
            // A typed handler reads JSON; data_base64 that is not JSON has no decoding into its type.
            fail(reason::decode_failed,
                 ": data does not decode as " + ev.type + ": it is binary (data_base64 of " +
                     std::to_string(ev.data.size()) + " bytes, " +
                     (ev.datacontenttype.empty() ? "no datacontenttype" : "datacontenttype '" + ev.datacontenttype + "'") +
                     "), and a typed handler takes JSON data only");
            continue;
        }
        if (!lifted.failure.empty()) {
            fail(lifted.undecodable ? reason::decode_failed : reason::upcast_failed, ": " + lifted.failure);
            continue;
        }
        try {
            out.decoded = lifted.decode_for(*h, ev.data);
        } catch (const std::exception& e) {
            fail(reason::decode_failed, ": data does not decode as " + std::string(type) +
                                            (lifted.changed ? " (after its upcasters)" : "") + ": " + e.what());
            continue;
        }
        try {
            proj.keys(*h, out.decoded.get(), m, out.keys);
            out.effect = proj.effect_key(*h, out.decoded.get(), m);
        } catch (const std::exception& e) {
            fail(reason::handler_failed, std::string(": key function threw: ") + e.what());
            continue;
        }
        if (out.keys.empty()) {
            fail(reason::missing_key, ": no aggregate key (the event has no subject)");
            continue;
        }
        if (out.effect && out.effect->empty()) {
            fail(reason::missing_key, ": the effect key is empty");
            continue;
        }
        std::sort(out.keys.begin(), out.keys.end());
        out.keys.erase(std::unique(out.keys.begin(), out.keys.end()), out.keys.end());
        if (out.keys.front().empty()) {
            fail(reason::missing_key, ": an aggregate key is empty");
            continue;
        }
        if (!out.effect && event_id.empty()) event_id = ev.event_id();
        out.contributors.resize(out.keys.size());
        out.contributor_hashes.resize(out.keys.size());
        out.key_hashes.resize(out.keys.size());
        for (std::size_t k = 0; k < out.keys.size(); ++k) {
            out.key_hashes[k] = std::hash<std::string_view>{}(out.keys[k]);
            out.contributors[k] = codec::contributor_key(out.keys[k], out.effect ? *out.effect : event_id);
            out.contributor_hashes[k] = id_log::hash_of(out.contributors[k]);
        }
    }
    parts.resize(used);
}

namespace {

// Without a valid envelope only the bytes say what the content is.
void unparsed(prepared_batch::item& out) {
    out.identity = 0;
    out.time_ns.reset();
    out.fingerprint = fingerprint_bytes(out.body);
    out.parts.clear();
}

// What follows from the envelope, parsed or read from a binary log's attributes.
void prepare_parsed(const store::impl& s, prepared_batch::item& out, std::uint64_t fingerprint) {
    // A transport id (the delivery's, else the envelope's msgid) counts within its transport.
    const auto& transport_id = out.transport_id.empty() ? out.ev.msgid : out.transport_id;
    out.message_id = transport_id.empty() ? out.ev.message_id() : transport_message_id(out.transport, transport_id);
    out.message_hash = id_log::hash_of(out.message_id);
    out.event_key.clear();
    out.shape = (id_log::hash_of(out.ev.type) ^ (out.ev.schema_version().value_or(0) * 0x9E3779B97F4A7C15ull) ^
                 (out.ev.sequence.value_or(0) * 0xC2B2AE3D27D4EB4Full)) | 1;
    if (!transport_id.empty()) {
        out.event_key.push_back('e');
        append_event_id(out.event_key, out.ev.source, out.ev.id);
        out.event_key_hash = id_log::hash_of(out.event_key);
    }
    out.identity = layout::event_identity(out.ev.event_id());
    out.subject_hash = std::hash<std::string_view>{}(out.ev.subject);
    out.time_ns = parse_event_time(out.ev.time);
    out.fingerprint = fingerprint;
    prepare_parts(s, out.ev, out.parts);
}

}  // namespace

bool prepare_envelope(const store::impl& s, prepared_batch::item& out, envelope_parser& parser) {
    if (!parser.parse(out.body, out.ev, out.err)) {
        unparsed(out);
        return false;
    }
    prepare_parsed(s, out, fingerprint(out.ev));
    return true;
}

namespace {

void prepare_item(const store::impl& s, const delivery& d, prepared_batch::item& out, envelope_parser& parser) {
    // The slot held an earlier batch's delivery: a large one's buffers are not kept for a small one.
    assign_reused(out.body, d.body);
    release_unneeded(out.ev.data, d.body.size());
    out.body_digest.reset();
    out.transport_id.assign(d.message_id);
    out.transport.assign(d.transport);
    out.signed_message_id = d.signed_message_id;
    out.line = d.line;
    out.offset = d.offset;
    const auto limit = s.options.max_event_bytes;
    if (limit != 0 && d.body.size() > limit) {
        out.err = {reason::too_large, "the envelope has " + std::to_string(d.body.size()) +
                                          " bytes, over the limit of " + std::to_string(limit)};
        out.body_digest = body_digest(d.body);
        unparsed(out);
        return;
    }
    // A binary log's record carries what parsing its body gives: no JSON is parsed again.
    std::uint64_t stored_fingerprint = 0;
    if (!d.attributes.empty() && decode_envelope_attributes(d.attributes, d.body, out.ev, stored_fingerprint)) {
        out.err.why = reason::none;
        out.err.detail.clear();
        prepare_parsed(s, out, stored_fingerprint);
        return;
    }
    prepare_envelope(s, out, parser);
}

}  // namespace
}  // namespace detail

prepared_batch store::prepare(std::span<const delivery> batch) const {
    prepared_batch out;
    prepare(batch, out);
    return out;
}

void store::prepare(std::span<const delivery> batch, prepared_batch& into) const {
    thread_local envelope_parser parser;
    into.items_.resize(batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i) {
        auto& slot = into.items_[i];
        if (!slot) slot = std::make_unique<prepared_batch::item>();
        detail::prepare_item(*impl_, batch[i], *slot, parser);
    }
}

}  // namespace idem
