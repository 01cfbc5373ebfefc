// Verify's comparison: two environments' rows walked in key order side by side, digested,
// and the first difference named.

#include <idem/sources/compare.hpp>

#include <idem/storage/error.hpp>

namespace idem {

namespace {

std::uint64_t fnv1a(std::uint64_t h, std::string_view bytes) {
    for (char ch : bytes) {
        auto c = static_cast<unsigned char>(ch);
        h ^= c;
        h *= 0x100000001b3ULL;
    }
    return h;
}

std::string row_bytes(const snapshot::raw_row_view& r) {
    std::string out;
    out.append(std::to_string(r.version)).push_back(' ');
    out.append(std::to_string(r.highest_sequence)).push_back(' ');
    out.append(std::to_string(r.state_version)).push_back(' ');
    out.append(r.state);
    return out;
}

std::string describe_row(const snapshot::raw_row_view& r) {
    return "row '" + std::string(r.key) + "' (version " + std::to_string(r.version) + ")";
}

}  // namespace

comparison compare(const std::filesystem::path& left, const std::filesystem::path& right,
                   const std::vector<std::string>& projections) {
    return compare(snapshot::open(left), left, snapshot::open(right), right, projections);
}

comparison compare(const snapshot& l, const std::filesystem::path& left, const snapshot& r,
                   const std::filesystem::path& right, const std::vector<std::string>& projections) {
    comparison out;
    for (const auto& name : projections) {
        // Both sides in key order, in step: memory stays flat however large the environments.
        projection_digest ld{name, 0, 0xcbf29ce484222325ULL};
        projection_digest rd{name, 0, 0xcbf29ce484222325ULL};
        // A projection without a table (a store that has not written it yet) has no rows.
        auto open_rows = [&](const snapshot& snap) {
            std::optional<snapshot::row_reader> rows;
            try {
                rows.emplace(snap.read_rows(name));
            } catch (const std::system_error& e) {
                if (e.code() != errc::unknown_projection) throw;
            }
            return rows;
        };
        auto lrows = open_rows(l);
        auto rrows = open_rows(r);
        auto next = [](std::optional<snapshot::row_reader>& rows) {
            return rows ? rows->next() : std::optional<snapshot::raw_row_view>{};
        };
        auto a = next(lrows);
        auto b = next(rrows);
        const std::string where = "projection '" + name + "': ";
        auto note = [&](std::string what) {
            if (!out.first_difference) out.first_difference = where + std::move(what);
        };
        while (a || b) {
            if (a && (!b || a->key < b->key)) {
                note(describe_row(*a) + " is only in " + left.string());
            } else if (b && (!a || b->key < a->key)) {
                note(describe_row(*b) + " is only in " + right.string());
            } else {
                const auto lb = row_bytes(*a);
                const auto rb = row_bytes(*b);
                if (lb != rb) {
                    note("row '" + std::string(a->key) + "' differs: " + left.string() + " has version " +
                         std::to_string(a->version) + ", " + right.string() + " has version " +
                         std::to_string(b->version) + (a->version == b->version ? " (states differ)" : ""));
                }
            }
            // Advance the side(s) holding the smaller key, digesting what is passed.
            const bool take_a = a && (!b || a->key <= b->key);
            const bool take_b = b && (!a || b->key <= a->key);
            if (take_a) {
                ld.digest = fnv1a(fnv1a(ld.digest, a->key), row_bytes(*a));
                ++ld.rows;
                a = next(lrows);
            }
            if (take_b) {
                rd.digest = fnv1a(fnv1a(rd.digest, b->key), row_bytes(*b));
                ++rd.rows;
                b = next(rrows);
            }
        }
        out.left.push_back(ld);
        out.right.push_back(rd);
    }
    return out;
}

}  // namespace idem