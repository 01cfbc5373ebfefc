#pragma once

// The `idem` command line as a library: build the same tool over your own projections.
//
//   int main(int argc, char** argv) {
//       idem::cli::tool tool{"positions-tool"};
//       tool.consumer("positions-projector").add(positions());
//       return tool.run(argc, argv);
//   }
//
// gives rebuild, consume, get, dump, stats, deadletters, verify, chaos, convert, why, prune, backup and the
// operator commands parked, release, redrive and audit over those projections. Exit status:
// 0 success (dead-lettered input is counted, not an error),
// 1 usage error (or a row that does not exist, or verify found a difference), 3 verify found
// the store behind its logs (equal to them up to its checkpoints),
// 2 I/O or storage failure, or a damaged store (verify --store; a read that faults inside
// a damaged map is reported, not left to kill the process); messages name the file and the cause.

#include <idem/projections/projection.hpp>
#include <idem/projections/store.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace idem::cli {

/// A bad command line: the tool prints it with the command's usage and exits with 1.
class usage_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// One option of a command.
struct option {
    std::string name;        ///< without dashes: "db"
    std::string value;       ///< the value's placeholder ("DIR"); empty for a flag
    std::string help;        ///< one line
    bool required = false;
    bool repeated = false;   ///< may be given several times (--log A --log B)
};

/// The options given to a command, checked against its option list.
class arguments {
public:
    arguments() = default;
    /// Holds values already checked: option name (without dashes) -> value ("" for a flag).
    arguments(std::string command, std::multimap<std::string, std::string, std::less<>> values);
    /// Parses argv (the words after the command) against known; throws usage_error naming the option.
    arguments(std::string command, const std::vector<option>& known, const std::vector<std::string>& argv);

    /// Returns the option's value, or nullopt if not given.
    std::optional<std::string> get(std::string_view name) const;
    /// Returns the option's value; throws usage_error naming it if absent.
    const std::string& required(std::string_view name) const;
    /// Returns every value of a repeated option, in order.
    std::vector<std::string> all(std::string_view name) const;
    /// Returns whether a flag was given.
    bool flag(std::string_view name) const;
    /// Returns an unsigned integer option (accepts 1000000, 1_000_000, 1e6, 1M); throws usage_error naming it.
    std::uint64_t number(std::string_view name, std::uint64_t fallback) const;
    /// Returns an unsigned integer option that must be at least 1 (a count or a size where 0 makes
    /// no sense: --batch, --step); throws usage_error naming it.
    std::uint64_t positive(std::string_view name, std::uint64_t fallback) const;
    /// Returns a decimal option in [0, 1] or any double; throws usage_error naming it.
    double real(std::string_view name, double fallback) const;
    /// Returns the command name (for messages).
    const std::string& command() const noexcept { return command_; }

private:
    std::string command_;
    std::multimap<std::string, std::string, std::less<>> values_;
};

/// A subcommand: its name, what it does, its options and its body (returns the exit status).
struct command {
    std::string name;
    std::string summary;
    std::vector<option> options;
    std::function<int(const arguments&)> run;
};

/// The tool: projections, their consumer name, and the commands over them.
class tool {
public:
    explicit tool(std::string name = "idem");
    ~tool();
    tool(const tool&) = delete;
    tool& operator=(const tool&) = delete;

    /// Adds a projection (kept as a prototype: every store the tool opens gets a copy).
    template <class State>
    tool& add(projection<State> p) {
        auto proto = std::make_shared<projection<State>>(std::move(p));
        return add_projection(proto, [proto](store& s) { s.add(projection<State>(*proto)); });
    }
    /// Adds an event upcasting step (<idem/projections/upcast.hpp>) to every store the tool opens.
    tool& upcast(upcaster step);
    /// Sets the consumer name the tool's stores use (default "idem").
    tool& consumer(std::string name);
    /// Adjusts the options of every store the tool opens (limits, gap policy, ...).
    tool& configure(std::function<void(store_options&)> fn);
    /// Adds (or replaces) a command, e.g. a domain's log generator.
    tool& add_command(command c);

    /// Parses argv, runs the command and returns the exit status; never throws.
    int run(int argc, char** argv);
    /// The same, from a vector of arguments (without the program name).
    int run(const std::vector<std::string>& args);

    struct impl;  ///< opaque: the implementation's state

private:
    tool& add_projection(std::shared_ptr<const projection_base> p, std::function<void(store&)> install);
    std::unique_ptr<impl> impl_;
};

/// Writes text to standard output in large blocks (a dump of millions of rows).
class output {
public:
    output();
    ~output();
    output(const output&) = delete;
    output& operator=(const output&) = delete;
    /// Appends to the buffer; writes it out when it is large.
    void write(std::string_view text);
    /// Writes everything buffered; throws std::system_error if stdout cannot be written.
    void flush();

private:
    std::string buffer_;
};

}  // namespace idem::cli
