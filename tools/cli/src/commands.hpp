#pragma once

// Commands of the tool kept in their own files: `why`, and the operator commands over dead
// letters and parked streams (`parked`, `release`, `redrive`, `audit`). tool.cpp passes them
// what they need of the tool.

#include <idem/cli/tool.hpp>
#include <idem/projections/store.hpp>
#include <idem/storage/writer_lock.hpp>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace idem::cli::detail {

/// What a command needs of its tool.
struct tool_context {
    std::string name;      ///< the tool's name (messages)
    std::string consumer;  ///< the consumer its stores use
    std::vector<std::shared_ptr<const projection_base>> projections;
    std::function<store_options(const std::filesystem::path&)> store_for;  ///< a store's options at db
    std::function<void(store&)> setup;                                      ///< adds the projections
    std::function<lock_wait(const arguments&, const std::filesystem::path&)> writer_wait;
};

/// `why`: prints explain() as JSON on stdout and its detail on stderr; returns the exit status.
int why(const tool_context& t, const arguments& a);

/// `parked`, `release`, `redrive` and `audit`.
std::vector<command> operator_commands(std::function<tool_context()> context);

/// Throws the ENOENT system_error every read command gives for a directory without a store.
void require_store(const std::filesystem::path& db);

}  // namespace idem::cli::detail
