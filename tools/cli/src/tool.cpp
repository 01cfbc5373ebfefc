// The tool's wiring: its projections and consumer, the list of commands (each built-in
// command lives in its own file, see commands.hpp), the usage texts, and run(), which parses
// a command line and maps what a command throws to the documented exit status.

#include <idem/cli/tool.hpp>

#include "command_line.hpp"
#include "commands.hpp"
#include "interrupt.hpp"
#include "map_fault.hpp"
#include "options.hpp"

#include <algorithm>
#include <cstdio>

namespace idem::cli {

namespace detail {

const projection_base& tool_context::projection_named(const std::string& n) const {
    for (const auto& p : projections) {
        if (p->name() == n) return *p;
    }
    std::string known;
    for (const auto& p : projections) known += (known.empty() ? "" : ", ") + p->name();
    throw usage_error("no projection named '" + n + "' (this tool has: " + known + ")");
}

std::vector<std::string> tool_context::projection_names() const {
    std::vector<std::string> out;
    for (const auto& p : projections) out.push_back(p->name());
    return out;
}

std::unique_ptr<store> tool_context::open_writer(const arguments& a, const std::filesystem::path& db,
                                                 const std::function<void(store_options&)>& adjust) const {
    require_store(db);
    auto o = store_for(db);
    o.wait_for_writer = writer_wait(name, a, db);
    if (adjust) adjust(o);
    auto s = std::make_unique<store>(o);
    setup(*s);
    return s;
}

void print(std::string_view json) {
    output out;
    out.write(json);
    out.flush();
}

}  // namespace detail

struct tool::impl {
    std::string name;
    std::string consumer = "idem";
    std::vector<std::shared_ptr<const projection_base>> projections;
    std::vector<std::function<void(store&)>> installers;
    std::vector<upcaster> upcasters;
    std::function<void(store_options&)> configure;
    std::vector<command> commands;

    store_options store_for(const std::filesystem::path& db) const {
        store_options o;
        o.path = db;
        o.consumer = consumer;
        o.unknown_types = unknown_type_policy::dead_letter;
        if (configure) configure(o);
        return o;
    }

    detail::tool_context context() const {
        detail::tool_context t;
        t.name = name;
        t.consumer = consumer;
        t.projections = projections;
        t.store_for = [this](const std::filesystem::path& db) { return store_for(db); };
        t.installers = installers;
        t.upcasters = upcasters;
        t.setup = [this](store& s) {
            for (const auto& install : installers) install(s);
            for (const auto& step : upcasters) s.upcast(step);
        };
        return t;
    }

    void add_builtin_commands() {
        const detail::context_fn t = [this] { return context(); };
        auto add = [this](std::vector<command> cs) {
            for (auto& c : cs) commands.push_back(std::move(c));
        };
        add(detail::log_run_commands(t));
        add(detail::read_commands(t));
        commands.push_back(detail::changes_command(t));
        commands.push_back(detail::deadletters_command(t));
        commands.push_back(detail::verify_command(t));
        commands.push_back(detail::chaos_command(t));
        commands.push_back(detail::prune_command(t));
        commands.push_back(detail::migrate_command(t));
        commands.push_back(detail::why_command(t));
        commands.push_back(detail::convert_command());
        commands.push_back(detail::backup_command(t));
        add(detail::operator_commands(t));
        add(detail::pause_commands(t));
#ifdef IDEM_JETSTREAM
        commands.push_back(detail::publish_command());
        commands.push_back(detail::relay_command(t));
        commands.push_back(detail::owners_command());
#endif
#ifdef IDEM_HTTP
        commands.push_back(detail::serve_command(t));
#endif
    }

    int usage(std::FILE* to) const;
    int help(const command& c, std::FILE* to) const;
};

int tool::impl::usage(std::FILE* to) const {
    std::fputs(detail::command_line{name, commands}.usage().c_str(), to);
    return to == stdout ? 0 : 1;
}

int tool::impl::help(const command& c, std::FILE* to) const {
    std::fputs(detail::command_line{name, commands}.help(c).c_str(), to);
    return to == stdout ? 0 : 1;
}

tool::tool(std::string name) : impl_(std::make_unique<impl>()) {
    impl_->name = std::move(name);
    impl_->add_builtin_commands();
}

tool::~tool() = default;

tool& tool::consumer(std::string name) {
    impl_->consumer = std::move(name);
    return *this;
}

tool& tool::upcast(upcaster step) {
    impl_->upcasters.push_back(std::move(step));
    return *this;
}

tool& tool::configure(std::function<void(store_options&)> fn) {
    impl_->configure = std::move(fn);
    return *this;
}

tool& tool::add_command(command c) {
    auto& cs = impl_->commands;
    auto it = std::find_if(cs.begin(), cs.end(), [&](const command& x) { return x.name == c.name; });
    if (it != cs.end()) {
        *it = std::move(c);
    } else {
        cs.push_back(std::move(c));
    }
    return *this;
}

tool& tool::add_projection(std::shared_ptr<const projection_base> p, std::function<void(store&)> install) {
    impl_->projections.push_back(std::move(p));
    impl_->installers.push_back(std::move(install));
    return *this;
}

int tool::run(int argc, char** argv) {
    std::vector<std::string> args;
    for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
    return run(args);
}

int tool::run(const std::vector<std::string>& args) {
    auto& s = *impl_;
    detail::map_fault_guard fault_guard;  // a fault inside a damaged map is reported, not silent
    if (args.empty()) return s.usage(stderr);
    if (args[0] == "help") return s.usage(stdout);
    detail::command_line::parsed parsed;
    try {
        parsed = detail::command_line{s.name, s.commands}.parse(args);
    } catch (const std::exception& e) {  // CLI11 refused a command's declaration (an embedder's option name)
        std::fprintf(stderr, "%s: %s\n", s.name.c_str(), e.what());
        return 2;
    }
    if (!parsed.unknown.empty()) {
        std::fprintf(stderr, "%s: unknown command '%s'\n", s.name.c_str(), parsed.unknown.c_str());
        s.usage(stderr);
        return 1;
    }
    if (parsed.chosen == nullptr) return s.usage(parsed.help ? stdout : stderr);
    const auto& c = *parsed.chosen;
    if (parsed.help) return s.help(c, stdout);
    try {
        if (!parsed.error.empty()) throw usage_error(parsed.error);
        if (auto db = parsed.args.get("db")) detail::note_store(s.name, *db);
        return c.run(parsed.args);
    } catch (const usage_error& e) {
        std::fprintf(stderr, "%s %s: %s\n", s.name.c_str(), c.name.c_str(), e.what());
        s.help(c, stderr);
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s %s: %s\n", s.name.c_str(), c.name.c_str(), e.what());
        return 2;
    }
}

}  // namespace idem::cli
