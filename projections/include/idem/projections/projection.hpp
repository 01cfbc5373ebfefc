#pragma once

// The projection model: a named read model with a state type, handlers per event
// type, a key function (which rows an event changes) and an effect key (what makes
// two deliveries the same business effect).
//
//   auto totals = idem::projection<order_total>("order-totals")
//       .on<line_added>([](order_total& t, const line_added& e) { t.total += e.amount; ++t.lines; })
//       .key([](const line_added& e) { return e.order_id; });
//
// States are serialized with cereal's portable binary archive; events are decoded
// from the envelope's `data` by the same serialize() function, through a cereal input
// archive over simdjson (json_archive.hpp). Handlers must be pure functions of (state, event): they run on a copy of
// the state and may run again if a batch is retried after the map grew.

#include <idem/projections/json_archive.hpp>
#include <idem/storage/envelope.hpp>
#include <idem/storage/error.hpp>

#include <cereal/archives/json.hpp>
#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <functional>
#include <istream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <streambuf>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeindex>
#include <vector>

namespace idem {

/// What a handler knows about the event besides its payload.
struct meta {
    std::string_view id;                    ///< CloudEvents id
    std::string_view source;                ///< CloudEvents source
    std::string_view type;                  ///< CloudEvents type
    std::string_view subject;               ///< CloudEvents subject ("" if absent)
    std::optional<std::uint64_t> sequence;  ///< position in the subject's stream
    std::string_view time;                  ///< event time as given ("" if absent)
    std::string_view key;                   ///< the aggregate key of the row being changed
};

/// Passed to projection::on() for a handler with the strong exception guarantee: should it
/// throw, it has not changed the state. Such a handler (and any noexcept one) runs on the row's
/// state itself when the event changes one row, instead of on a copy installed afterwards
/// (an event that changes several rows still runs on copies: all of them or none).
struct strong_guarantee_t {
    explicit strong_guarantee_t() = default;
};
inline constexpr strong_guarantee_t strong_guarantee{};

/// One projection row as read back: its state and version.
template <class State>
struct row {
    std::string key;                     ///< aggregate key
    State state;                         ///< the read model
    std::uint64_t version = 0;           ///< number of events applied to the row
    std::uint64_t highest_sequence = 0;  ///< highest stream sequence applied (rows keyed by their own subject)
};

namespace detail {

/// A type-erased projection state.
class state_box {
public:
    virtual ~state_box() = default;
    virtual std::unique_ptr<state_box> clone() const = 0;
    /// Copies this state over into, a box of the same state type, reusing what into holds.
    virtual void copy_to(state_box& into) const = 0;
};

template <class State>
class typed_state final : public state_box {
public:
    State value{};
    std::unique_ptr<state_box> clone() const override { return std::make_unique<typed_state>(*this); }
    void copy_to(state_box& into) const override { static_cast<typed_state&>(into).value = value; }
};

/// A read-only streambuf over bytes, so cereal can read a map view without copying it.
class view_buf : public std::streambuf {
public:
    explicit view_buf(std::string_view bytes) {
        char* p = const_cast<char*>(bytes.data());  // NOLINT: get area is never written
        setg(p, p, p + bytes.size());
    }
};

/// Decodes State from cereal portable binary bytes.
template <class State>
State load_state(std::string_view bytes) {
    view_buf buf{bytes};
    std::istream in{&buf};
    cereal::PortableBinaryInputArchive archive{in};
    State state{};
    archive(state);
    return state;
}

/// A streambuf that appends to a std::string, so cereal writes without an extra copy.
class append_buf : public std::streambuf {
public:
    explicit append_buf(std::string& out) : out_(out) {}

protected:
    int_type overflow(int_type c) override {
        if (!traits_type::eq_int_type(c, traits_type::eof())) out_.push_back(traits_type::to_char_type(c));
        return traits_type::not_eof(c);
    }
    std::streamsize xsputn(const char* s, std::streamsize n) override {
        out_.append(s, static_cast<std::size_t>(n));
        return n;
    }

private:
    std::string& out_;
};

/// Encodes State as cereal portable binary bytes, appended to out.
template <class State>
void save_state(const State& state, std::string& out) {
    append_buf buf{out};
    std::ostream os{&buf};
    cereal::PortableBinaryOutputArchive archive{os};
    archive(state);
}

/// A state migration threw: the event that needed the row is dead-lettered (upcast_failed).
class migration_failed : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// One step of a projection's state chain: reads a row written at one state version and
/// returns the state of the next.
struct migration {
    std::type_index from = typeid(void);  ///< the state type at that version
    std::type_index to = typeid(void);    ///< the state type of the next version
    std::function<std::shared_ptr<void>(std::string_view bytes)> load;  ///< decodes a row's state bytes
    std::function<std::shared_ptr<void>(const void* old)> lift;         ///< from -> to
};
using migrations = std::map<std::uint32_t, migration>;

/// Reads bytes written at state version `version` and lifts them to `current`; returns the
/// state of type `current_type`. Throws errc::state_version_mismatch naming the projection when
/// no chain leads there, migration_failed when a step throws.
std::shared_ptr<void> migrate(const migrations& steps, const std::string& projection, std::string_view bytes,
                              std::uint32_t version, std::uint32_t current);
/// Checks a chain when its projection is added: every version from the oldest step to current
/// has a step, each step's state type is the previous step's result, and the last one's is
/// current_type. Throws errc::invalid_argument naming the projection and the step.
void check_migrations(const migrations& steps, const std::string& projection, std::uint32_t current,
                      std::type_index current_type);

template <class E>
concept member_serializable = requires(cereal::JSONInputArchive& a, E& e) { e.serialize(a); };

template <class S>
concept member_json_saveable = requires(cereal::JSONOutputArchive& a, S& s) { s.serialize(a); };

/// Appends cereal's (indented) JSON text to out as compact JSON.
void append_compact_json(std::string_view json, std::string& out);

/// Appends State as a compact JSON object through its cereal serialize() (its field names are the JSON's).
template <class State>
void write_json(const State& state, std::string& out) {
    std::ostringstream os;
    {
        cereal::JSONOutputArchive archive{os, cereal::JSONOutputArchive::Options::NoIndent()};
        if constexpr (member_json_saveable<State>) {
            const_cast<State&>(state).serialize(archive);  // NOLINT: cereal's serialize() is non-const, saving does not modify
        } else {
            archive(cereal::make_nvp("value", state));
        }
    }
    append_compact_json(os.view(), out);
}

/// Decodes an event payload (JSON text) into E through E's cereal serialize().
template <class E>
std::shared_ptr<const void> decode_event(std::string_view data) {
    auto event = std::make_shared<E>();
    if constexpr (requires(json_input_archive& a, E& e) { e.serialize(a); }) {
        // The payload object is the archive's root: E's fields are read from it directly.
        json_input_archive archive{data};
        event->serialize(archive);
    } else if constexpr (member_serializable<E>) {
        // A serialize() written for cereal's JSON archive alone.
        view_buf buf{data};
        std::istream in{&buf};
        cereal::JSONInputArchive archive{in};
        event->serialize(archive);
    } else {
        // Wrapping as {"e": data} lets cereal read E with any of its other serialization forms.
        std::string wrapped = "{\"e\":";
        wrapped.append(data);
        wrapped.push_back('}');
        view_buf buf{wrapped};
        std::istream in{&buf};
        cereal::JSONInputArchive archive{in};
        archive(cereal::make_nvp("e", *event));
    }
    return event;
}

// The first parameter type of a callable (lambdas with one non-generic operator()).
template <class F>
struct first_param : first_param<decltype(&F::operator())> {};
template <class C, class R, class A, class... Rest>
struct first_param<R (C::*)(A, Rest...) const> {
    using type = std::remove_cvref_t<A>;
};
template <class C, class R, class A, class... Rest>
struct first_param<R (C::*)(A, Rest...)> {
    using type = std::remove_cvref_t<A>;
};
template <class R, class A, class... Rest>
struct first_param<R (*)(A, Rest...)> {
    using type = std::remove_cvref_t<A>;
};

template <class E>
concept has_event_type = requires { std::string_view{E::event_type}; };

/// Appends what a key function returned (one key, or several) to keys.
template <class R>
void collect_keys(R&& result, std::vector<std::string>& keys) {
    if constexpr (std::is_convertible_v<R, std::string_view>) {
        keys.emplace_back(std::string_view{result});
    } else {
        for (auto&& k : result) keys.emplace_back(std::string_view{k});
    }
}

template <class F, class E>
decltype(auto) call_with_meta(F& f, const E& e, const meta& m) {
    if constexpr (std::is_invocable_v<F&, const E&, const meta&>) {
        return f(e, m);
    } else {
        return f(e);
    }
}

}  // namespace detail

/// The type-erased interface the apply path uses; built by projection<State>.
class projection_base {
public:
    using decoder = std::function<std::shared_ptr<const void>(std::string_view data)>;
    using key_fn = std::function<void(const void* event, const meta& m, std::vector<std::string>& keys)>;
    using effect_fn = std::function<std::string(const void* event, const meta& m)>;
    using apply_fn = std::function<void(detail::state_box& state, const void* event, const meta& m)>;

    /// One handled event type.
    struct handler {
        std::type_index event = typeid(void);
        decoder decode;
        apply_fn apply;
        bool in_place = false;  ///< a throw leaves the state unchanged (noexcept, or strong_guarantee)
    };

    virtual ~projection_base() = default;

    /// Returns the projection's name (its table is "proj/<name>").
    const std::string& name() const noexcept { return name_; }
    /// Returns the state format version written into every row record.
    std::uint32_t state_version() const noexcept { return state_version_; }
    /// Returns the handler for a CloudEvents type, or null if the projection ignores it.
    const handler* find(std::string_view type) const {
        auto it = handlers_.find(type);
        return it == handlers_.end() ? nullptr : &it->second;
    }
    /// Computes the aggregate keys an event changes (default: its subject).
    void keys(const handler& h, const void* event, const meta& m, std::vector<std::string>& out) const {
        if (auto it = key_fns_.find(h.event); it != key_fns_.end()) {
            it->second(event, m, out);
        } else if (!m.subject.empty()) {
            out.emplace_back(m.subject);
        }
    }
    /// Computes the event's effect key, or nullopt for the default (the event id).
    std::optional<std::string> effect_key(const handler& h, const void* event, const meta& m) const {
        if (auto it = effect_fns_.find(h.event); it != effect_fns_.end()) {
            return it->second(event, m);
        }
        return std::nullopt;
    }

    /// Returns whether the projection records its row changes in the change feed (changes()).
    bool records_changes() const noexcept { return changes_; }
    /// Returns whether any handled event type has an effect key function (else effects are keyed by event id).
    bool keys_effects() const noexcept { return !effect_fns_.empty(); }

    /// Returns a default-constructed state.
    virtual std::unique_ptr<detail::state_box> make_state() const = 0;
    /// Decodes a stored state written with state format version `version`.
    virtual std::unique_ptr<detail::state_box> load(std::string_view bytes, std::uint32_t version) const = 0;
    /// Appends the encoded state to out.
    virtual void save(const detail::state_box& state, std::string& out) const = 0;
    /// Appends the state as a compact JSON object (what `idem get` and `idem dump` print).
    virtual void write_json(const detail::state_box& state, std::string& out) const = 0;
    /// Checks what must hold before the projection is used (its migration chain); throws
    /// errc::invalid_argument naming it.
    virtual void check() const {}

protected:
    explicit projection_base(std::string name) : name_(std::move(name)) {}

    std::string name_;
    std::uint32_t state_version_ = 1;
    bool changes_ = false;
    std::map<std::string, handler, std::less<>> handlers_;
    std::map<std::type_index, key_fn> key_fns_;
    std::map<std::type_index, effect_fn> effect_fns_;
};

/// A projection whose rows hold a State (default-constructible, cereal-serializable).
template <class State>
class projection final : public projection_base {
public:
    /// Names the projection; the name is part of the storage layout, keep it stable.
    explicit projection(std::string name) : projection_base(std::move(name)) {}

    /// Handles events of type `type` decoded as E with fn(State&, const E&[, const meta&]).
    /// The handler runs on a copy of the row's state, installed only if every handler of the
    /// event succeeded; a noexcept fn runs on the state itself where the event changes one row.
    template <class E, class F>
    projection& on(std::string type, F fn) & {
        // Of the call add_handler makes: with meta where fn takes it.
        constexpr bool nothrow = std::is_invocable_v<F&, State&, const E&, const meta&>
                                     ? std::is_nothrow_invocable_v<F&, State&, const E&, const meta&>
                                     : std::is_nothrow_invocable_v<F&, State&, const E&>;
        return add_handler<E>(std::move(type), std::move(fn), nothrow);
    }
    /// The same for a fn that leaves the state unchanged when it throws (it validates before it
    /// changes anything): it too runs on the state itself where the event changes one row.
    template <class E, class F>
    projection& on(std::string type, F fn, strong_guarantee_t) & {
        return add_handler<E>(std::move(type), std::move(fn), true);
    }
    /// Handles events of E's own type name (`static constexpr const char* event_type`).
    template <detail::has_event_type E, class F>
    projection& on(F fn) & {
        return on<E>(std::string(E::event_type), std::move(fn));
    }
    /// The same with the strong exception guarantee (see strong_guarantee_t).
    template <detail::has_event_type E, class F>
    projection& on(F fn, strong_guarantee_t g) & {
        return on<E>(std::string(E::event_type), std::move(fn), g);
    }

    /// Sets which rows an E changes: fn(const E&[, const meta&]) returns a key or a range of keys.
    template <class F, class E = typename detail::first_param<F>::type>
    projection& key(F fn) & {
        key_fns_[typeid(E)] = [fn = std::move(fn)](const void* event, const meta& m, std::vector<std::string>& out) mutable {
            detail::collect_keys(detail::call_with_meta(fn, *static_cast<const E*>(event), m), out);
        };
        return *this;
    }
    /// Sets the business idempotency key of an E: fn(const E&[, const meta&]) returns a string.
    template <class F, class E = typename detail::first_param<F>::type>
    projection& effect_key(F fn) & {
        effect_fns_[typeid(E)] = [fn = std::move(fn)](const void* event, const meta& m) mutable {
            return std::string(std::string_view{detail::call_with_meta(fn, *static_cast<const E*>(event), m)});
        };
        return *this;
    }
    /// Sets the state format version recorded in rows (raise it when State's encoding changes).
    projection& state_version(std::uint32_t v) & {
        state_version_ = v;
        return *this;
    }
    /// Records every row change in the store's change feed (docs/CHANGES.md): each commit's
    /// changed rows with their new version and state, read by snapshot::changes(), engine
    /// subscriptions, `idem changes`, GET /changes and `idem relay`. Off by default: a write per
    /// changed row that nobody follows is a cost.
    projection& changes(bool on = true) & {
        changes_ = on;
        return *this;
    }
    /// Declares how a row written at state version `from` is read: fn(const Old&) returns the
    /// state of version from + 1 (State itself for the version before the current one). Rows
    /// are migrated when read and rewritten at the current version when next changed.
    template <class Old, class F>
    projection& migrate(std::uint32_t from, F fn) & {
        using Next = std::remove_cvref_t<std::invoke_result_t<F&, const Old&>>;
        detail::migration m;
        m.from = typeid(Old);
        m.to = typeid(Next);
        m.load = [](std::string_view bytes) -> std::shared_ptr<void> {
            return std::make_shared<Old>(detail::load_state<Old>(bytes));
        };
        m.lift = [fn = std::move(fn)](const void* old) mutable -> std::shared_ptr<void> {
            return std::make_shared<Next>(fn(*static_cast<const Old*>(old)));
        };
        migrations_.insert_or_assign(from, std::move(m));
        return *this;
    }

    // Rvalue overloads so a projection can be built and handed over in one expression.
    template <class E, class F>
    projection&& on(std::string type, F fn) && { return std::move(on<E>(std::move(type), std::move(fn))); }
    template <detail::has_event_type E, class F>
    projection&& on(F fn) && { return std::move(on<E>(std::move(fn))); }
    template <class E, class F>
    projection&& on(std::string type, F fn, strong_guarantee_t g) && {
        return std::move(on<E>(std::move(type), std::move(fn), g));
    }
    template <detail::has_event_type E, class F>
    projection&& on(F fn, strong_guarantee_t g) && { return std::move(on<E>(std::move(fn), g)); }
    template <class F>
    projection&& key(F fn) && { return std::move(key(std::move(fn))); }
    template <class F>
    projection&& effect_key(F fn) && { return std::move(effect_key(std::move(fn))); }
    projection&& state_version(std::uint32_t v) && { return std::move(state_version(v)); }
    projection&& changes(bool on = true) && { return std::move(changes(on)); }
    template <class Old, class F>
    projection&& migrate(std::uint32_t from, F fn) && { return std::move(migrate<Old>(from, std::move(fn))); }

    std::unique_ptr<detail::state_box> make_state() const override {
        return std::make_unique<detail::typed_state<State>>();
    }
    std::unique_ptr<detail::state_box> load(std::string_view bytes, std::uint32_t version) const override {
        if (version > state_version_) {
            throw_error(errc::state_version_mismatch,
                        "projection '" + name_ + "': row has state version " + std::to_string(version) +
                            ", this code knows up to " + std::to_string(state_version_));
        }
        auto box = std::make_unique<detail::typed_state<State>>();
        if (version == state_version_) {
            try {
                box->value = detail::load_state<State>(bytes);
            } catch (const std::exception& e) {
                throw_error(errc::corrupt_record,
                            "projection '" + name_ + "': a row's stored state (" + std::to_string(bytes.size()) +
                                " bytes, state version " + std::to_string(version) + ") does not decode: " + e.what() +
                                "; the store is damaged, or the state's serialization changed without a new state "
                                "version (idem verify --store names the row)");
            }
        } else {
            box->value = std::move(*static_cast<State*>(detail::migrate(migrations_, name_, bytes, version, state_version_).get()));
        }
        return box;
    }
    void check() const override { detail::check_migrations(migrations_, name_, state_version_, typeid(State)); }
    void save(const detail::state_box& state, std::string& out) const override {
        detail::save_state(static_cast<const detail::typed_state<State>&>(state).value, out);
    }
    void write_json(const detail::state_box& state, std::string& out) const override {
        detail::write_json(static_cast<const detail::typed_state<State>&>(state).value, out);
    }

private:
    template <class E, class F>
    projection& add_handler(std::string type, F fn, bool in_place) {
        handler h;
        h.event = typeid(E);
        h.in_place = in_place;
        h.decode = &detail::decode_event<E>;
        h.apply = [fn = std::move(fn)](detail::state_box& state, const void* event, const meta& m) mutable {
            auto& s = static_cast<detail::typed_state<State>&>(state).value;
            const auto& e = *static_cast<const E*>(event);
            if constexpr (std::is_invocable_v<F&, State&, const E&, const meta&>) {
                fn(s, e, m);
            } else {
                fn(s, e);
            }
        };
        handlers_.insert_or_assign(std::move(type), std::move(h));
        return *this;
    }

    detail::migrations migrations_;
};

}  // namespace idem
