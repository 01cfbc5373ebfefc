#pragma once

// A structural check of an LMDB environment's data file that cannot crash on a damaged
// one. LMDB keeps no page checksums and follows the page numbers it reads: a flipped byte
// in a branch page or a truncated file ends a reader with SIGSEGV or SIGBUS. This check
// reads data.mdb with pread (it never maps it) and walks LMDB's on-disk format (0.9.x,
// 64-bit page numbers) itself:
//
// - both meta pages (flags, magic, version, page size, map size, last page); the newer
//   valid one is walked, a bad one is reported;
// - every B-tree from its root: the free-page table, the main table and each named table.
//   Per page: number in range, the header's page number equal to where it was read, known
//   flags, free-space bounds, node offsets and key/data sizes inside the page, keys
//   strictly ascending and inside the bounds the parent gives (LMDB's default comparator,
//   integers for the free-page table), every leaf at the tree's depth, overflow runs inside
//   the file; each table's counts (pages by kind, entries, depth) equal to what was found;
// - every page reached once: by one tree, as free (listed in the free-page table) or as a
//   meta page. A page reached twice, or by none (leaked), is reported.
//
// idem never opens a table with flags (no dupsort, no integer keys): a table with flags,
// or a node with duplicate data, is reported as unexpected. The check reads the file as it
// is: run it on a store no writer is changing (a commit during the check is detected and
// the check started over, up to three times).

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace idem {

/// One thing found wrong in an environment's data file.
struct page_problem {
    std::optional<std::uint64_t> page;  ///< the page it was found on (none: the file as a whole)
    std::string table;                  ///< "(meta)", "(free)", "(main)", a table name, or empty
    std::string what;                   ///< what is wrong, in words
};

/// What the walk found of one table (B-tree).
struct table_check {
    std::string name;                  ///< "(free)", "(main)" or the table's name
    std::uint64_t root = 0;            ///< its root page (all ones: empty)
    std::uint64_t entries = 0;         ///< leaf entries found
    std::uint64_t branch_pages = 0;    ///< branch pages found
    std::uint64_t leaf_pages = 0;      ///< leaf pages found
    std::uint64_t overflow_pages = 0;  ///< overflow pages found
    unsigned depth = 0;                ///< the depth the table's record gives
};

/// The outcome of check_environment().
struct environment_report {
    std::filesystem::path file;          ///< the data file checked
    std::uint64_t page_size = 0;         ///< from the meta page walked (0: no valid meta)
    std::uint64_t pages = 0;             ///< pages the meta says the file uses (its last page + 1)
    std::uint64_t file_pages = 0;        ///< whole pages the file holds
    std::uint64_t transaction = 0;       ///< the transaction that wrote the meta page walked
    std::uint64_t free_pages = 0;        ///< pages listed in the free-page table
    std::vector<table_check> tables;     ///< free, main, then named tables in key order
    std::vector<page_problem> problems;  ///< the first problems found, in walk order
    std::uint64_t problem_count = 0;     ///< every problem found (problems keeps the first max_problems)

    /// Returns whether the structure is sound (no problem found).
    bool sound() const noexcept { return problem_count == 0; }
    /// Returns the first n problems in words, "; " between them ("page 7 (table t): ...").
    std::string first_problems(std::size_t n = 3) const;
};

/// Returns a problem in words: where it was found ("page 7 (table t)"), then what is wrong.
std::string to_string(const page_problem& p);

/// Checks the structure of the LMDB data file at path (a data.mdb, or an environment
/// directory holding one) without mapping it; keeps the first max_problems problems.
/// Never throws for what the file holds: damage, truncation and an unreadable file are
/// problems in the report. Throws std::system_error only if memory runs out.
environment_report check_environment(const std::filesystem::path& path, std::size_t max_problems = 100);

}  // namespace idem
