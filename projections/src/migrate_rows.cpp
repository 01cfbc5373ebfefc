// Rewriting the rows of older state versions at the current one (store::migrate_rows): the
// keys are collected from a snapshot, then rewritten in bounded transactions through the batch
// path, which reads a row through its projection's migrations and writes it at the current
// version (into the row journal or the table, as any changed row).

#include <idem/projections/store.hpp>

#include "store_internal.hpp"  // before operator_session.hpp: the LMDB types it names
#include "operator_session.hpp"

#include <idem/storage/error.hpp>

#include <string>
#include <utility>
#include <vector>

namespace idem {

migrate_result store::migrate_rows(std::size_t per_step, const std::function<void(const migrate_result&)>& progress) {
    if (per_step == 0) throw_error(errc::invalid_argument, "migrate_rows: per_step must be positive");
    // Only the keys of older rows are kept, not their states: the snapshot is released before writing.
    std::vector<std::pair<std::size_t, std::string>> old;
    {
        const auto snap = read();
        for (std::size_t p = 0; p < impl_->projections.size(); ++p) {
            const auto& proj = *impl_->projections[p];
            auto reader = [&] {
                try {
                    return std::optional(snap.read_rows(proj.name()));
                } catch (const std::system_error& e) {
                    if (e.code() == errc::unknown_projection) return std::optional<snapshot::row_reader>();
                    throw;
                }
            }();
            if (!reader) continue;
            while (auto r = reader->next()) {
                if (r->state_version == proj.state_version()) continue;
                if (r->state_version > proj.state_version()) {
                    throw_error(errc::state_version_mismatch,
                                "projection '" + proj.name() + "': row '" + std::string(r->key) + "' has state version " +
                                    std::to_string(r->state_version) + ", this code knows up to " +
                                    std::to_string(proj.state_version()));
                }
                old.emplace_back(p, std::string(r->key));
            }
        }
    }
    migrate_result result;
    result.remaining = old.size();
    for (std::size_t at = 0; at < old.size(); at += per_step) {
        const auto end = std::min(old.size(), at + per_step);
        operate([&](detail::operator_session& op) {
            for (auto i = at; i < end; ++i) {
                try {
                    op.rewrite_row(old[i].first, old[i].second);
                } catch (const detail::migration_failed& e) {
                    throw_error(errc::invalid_argument, "row '" + old[i].second + "': " + e.what());
                }
            }
            return true;
        });
        result.rows += end - at;
        result.remaining -= end - at;
        ++result.commits;
        if (progress) progress(result);
    }
    return result;
}

}  // namespace idem
