#pragma once

// The tool's command line, parsed by CLI11: `TOOL COMMAND [--option VALUE | --flag]...`.
// CLI11 splits the words (--name VALUE, --name=VALUE), picks the command and formats the
// help; what it parsed is then checked against each command's option list, so a usage error
// names the option and the cause in the tool's own words ("option '--db' given twice").

#include <idem/cli/tool.hpp>

#include <memory>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace idem::cli::detail {

class command_line {
public:
    /// Describes tool with its commands; the commands must outlive it.
    command_line(const std::string& tool, const std::vector<command>& commands);
    ~command_line();
    command_line(const command_line&) = delete;
    command_line& operator=(const command_line&) = delete;

    /// What a command line asks for.
    struct parsed {
        const command* chosen = nullptr;  ///< the command (nullptr: none, or one the tool does not have)
        bool help = false;                ///< --help or -h was given
        std::string unknown;              ///< a word where a command was expected
        std::string error;                ///< a usage error of the chosen command ("" if none)
        arguments args;                   ///< its options, if there is no error
    };

    /// Parses args (without the program name). Never throws for bad input.
    parsed parse(const std::vector<std::string>& args);

    /// Returns the tool's help: its commands and the exit statuses.
    std::string usage() const;
    /// Returns a command's help: its usage line and options.
    std::string help(const command& c) const;

private:
    struct state;
    std::unique_ptr<state> s_;
};

}  // namespace idem::cli::detail
