#pragma once

// What an environment directory holds, for the commands that replace or remove one: a
// rebuild swaps whole directories and deletes the old one, so it must be sure the directory
// holds a store and nothing else (a log kept beside data.mdb would be deleted with it).

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace idem {

/// Returns the entries of dir that are not part of an idem store (data.mdb, lock.mdb, idem.lock,
/// idem.health, idem.pause, and a creation in progress), sorted; empty if dir does not exist.
std::vector<std::string> foreign_files(const std::filesystem::path& dir);

/// Removes dir if it holds only a store's files; throws errc::invalid_argument naming the other
/// files (and removes nothing) if it holds more. A missing dir is not an error.
void remove_store_dir(const std::filesystem::path& dir);

/// Syncs the directory dir itself, so that an entry created, renamed or removed in it survives a
/// crash; throws std::system_error naming dir.
void sync_dir(const std::filesystem::path& dir);

/// Removes the stores beside dir named "<dir's name><infix><pid>" whose process is gone (the
/// private stores of killed runs, as verify makes them); ones holding foreign files are kept.
void remove_leftovers(const std::filesystem::path& dir, std::string_view infix);

}  // namespace idem
