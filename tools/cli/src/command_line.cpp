#include "command_line.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <map>

namespace idem::cli::detail {

namespace {

// CLI11's help layout with the tool's usage lines: every option of a command spelled out,
// optional ones in brackets, as the commands' docs and error messages show them.
class help_format : public CLI::Formatter {
public:
    std::map<const CLI::App*, const command*> commands;
    std::string tool;

    std::string make_description(const CLI::App*) const override { return {}; }

    std::string make_usage(const CLI::App* app, std::string) const override {
        auto it = commands.find(app);
        if (it == commands.end()) {
            return "usage: " + tool + " COMMAND [OPTIONS]   (" + tool + " COMMAND --help for its options)\n";
        }
        const command& c = *it->second;
        std::string line = "usage: " + tool + " " + c.name;
        for (const auto& o : c.options) {
            std::string part = "--" + o.name + (o.value.empty() ? "" : " " + o.value);
            if (o.repeated) part += " [--" + o.name + " ...]";
            line += o.required ? " " + part : " [" + part + "]";
        }
        return line + "\n\n" + c.summary + "\n";
    }
};

std::string no_dashes(const std::string& word) {
    auto name = word.substr(0, word.find('='));
    return name;
}

}  // namespace

struct command_line::state {
    std::string tool;
    const std::vector<command>* commands = nullptr;
    CLI::App app;
    std::shared_ptr<help_format> format = std::make_shared<help_format>();
    std::vector<CLI::App*> subs;                      // per command
    std::vector<std::vector<CLI::Option*>> options;  // per command, in its option order

    state(const std::string& t, const std::vector<command>& cs) : tool(t), commands(&cs), app("", t) {
        format->tool = t;
        format->label("OPTIONS", "options");
        format->label("SUBCOMMANDS", "commands");
        format->label("SUBCOMMAND", "COMMAND");
        format->column_width(29);
        app.formatter(format);
        app.option_defaults()->group("options");
        app.set_help_flag("-h,--help", "show this help");
        app.allow_extras();
        app.require_subcommand(0, 1);
        app.footer(
            "exit status: 0 success (dead-lettered input is counted, not an error), 1 usage error,\n"
            "2 I/O or storage failure; verify: 1 differs, 3 behind its logs.");
        for (const auto& c : cs) {
            auto* sub = app.add_subcommand(c.name, c.summary);
            sub->allow_extras();
            sub->group("commands");
            sub->footer("");
            sub->get_help_ptr()->group("options");
            format->commands[sub] = &c;
            std::vector<CLI::Option*> opts;
            for (const auto& o : c.options) {
                const std::string text = o.help + (o.required ? " (required)" : "");
                CLI::Option* opt = nullptr;
                if (o.value.empty()) {
                    opt = sub->add_flag("--" + o.name, text);
                } else {
                    // Zero values accepted here, so a missing one is reported in the tool's words.
                    opt = sub->add_option("--" + o.name, text)->type_name(o.value)->expected(0, 1);
                }
                opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
                opts.push_back(opt);
            }
            subs.push_back(sub);
            options.push_back(std::move(opts));
        }
    }

    /// Checks what CLI11 parsed for command i; returns the usage error or "".
    std::string check(std::size_t i, std::multimap<std::string, std::string, std::less<>>& values) const {
        const auto& c = (*commands)[i];
        if (const auto rest = subs[i]->remaining(); !rest.empty()) {
            const auto& word = rest.front();
            if (word.size() > 2 && word.starts_with("--")) return "unknown option '" + no_dashes(word) + "'";
            return "unexpected argument '" + word + "' (options start with --)";
        }
        for (std::size_t k = 0; k < c.options.size(); ++k) {
            const auto& o = c.options[k];
            const auto* opt = options[i][k];
            const auto& results = opt->results();
            if (opt->count() > 1 && !o.repeated) return "option '--" + o.name + "' given twice";
            if (o.value.empty()) {
                if (std::any_of(results.begin(), results.end(), [](const std::string& r) { return r != "true"; })) {
                    return "option '--" + o.name + "' takes no value";
                }
                if (opt->count() != 0) values.emplace(o.name, "");
                continue;
            }
            // CLI11 records an option given without its value as an empty one.
            if (results.size() < opt->count() ||
                std::any_of(results.begin(), results.end(), [](const std::string& r) { return r.empty(); })) {
                return "option '--" + o.name + "' needs a value (" + o.value + ")";
            }
            for (const auto& r : results) values.emplace(o.name, r);
        }
        for (const auto& o : c.options) {
            if (o.required && values.count(o.name) == 0) return "missing option '--" + o.name + " " + o.value + "'";
        }
        return {};
    }
};

command_line::command_line(const std::string& tool, const std::vector<command>& commands)
    : s_(std::make_unique<state>(tool, commands)) {}

command_line::~command_line() = default;

command_line::parsed command_line::parse(const std::vector<std::string>& args) {
    parsed r;
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes the words last first
    auto chosen = [&]() -> std::size_t {
        const auto picked = s_->app.get_subcommands();
        if (picked.empty()) return s_->subs.size();
        return static_cast<std::size_t>(std::find(s_->subs.begin(), s_->subs.end(), picked.front()) -
                                        s_->subs.begin());
    };
    try {
        s_->app.parse(reversed);
    } catch (const CLI::CallForHelp&) {
        r.help = true;
    } catch (const CLI::ParseError& e) {
        r.error = e.what();
    }
    const auto i = chosen();
    if (const auto rest = s_->app.remaining(); !rest.empty()) {
        r.unknown = rest.front();  // words before the command, or a command the tool does not have
        return r;
    }
    if (i == s_->subs.size()) return r;
    r.chosen = &(*s_->commands)[i];
    if (r.help || !r.error.empty()) return r;
    std::multimap<std::string, std::string, std::less<>> values;
    r.error = s_->check(i, values);
    if (r.error.empty()) r.args = arguments{r.chosen->name, std::move(values)};
    return r;
}

std::string command_line::usage() const { return s_->app.help(); }

std::string command_line::help(const command& c) const {
    for (std::size_t i = 0; i < s_->subs.size(); ++i) {
        if (&(*s_->commands)[i] == &c) return s_->subs[i]->help();
    }
    return {};
}

}  // namespace idem::cli::detail
