#include "shrink.hpp"

#include <utility>

namespace idem::testing::detail {

namespace {

class shrinker {
public:
    shrinker(shrunk s, const failure_test& fails, std::size_t max_runs)
        : best_(std::move(s)), fails_(fails), runs_left_(max_runs) {}

    /// Keeps candidate if it still fails; returns whether it did.
    bool attempt(std::vector<step> candidate) {
        if (runs_left_ == 0 || deliveries(candidate) == 0) return false;
        --runs_left_;
        auto d = fails_(candidate);
        if (!d) return false;
        best_ = {std::move(candidate), std::move(*d)};
        return true;
    }

    // Removes runs of steps, long runs first (a failure usually needs few of them).
    bool drop_steps() {
        bool any = false;
        for (std::size_t chunk = std::max<std::size_t>(1, steps().size() / 2); chunk >= 1; chunk /= 2) {
            for (std::size_t i = 0; i + chunk <= steps().size() && runs_left_ > 0;) {
                auto c = steps();
                c.erase(c.begin() + static_cast<std::ptrdiff_t>(i), c.begin() + static_cast<std::ptrdiff_t>(i + chunk));
                if (attempt(std::move(c))) {
                    any = true;
                } else {
                    i += chunk;
                }
            }
            if (chunk == 1) break;
        }
        return any;
    }

    // Removes single deliveries from batches of several.
    bool drop_deliveries() {
        bool any = false;
        for (std::size_t s = 0; s < steps().size(); ++s) {
            for (std::size_t d = 0; d < steps()[s].batch.size() && steps()[s].batch.size() > 1 && runs_left_ > 0;) {
                auto c = steps();
                c[s].batch.erase(c[s].batch.begin() + static_cast<std::ptrdiff_t>(d));
                if (c[s].crash == crash_kind::killed && c[s].point == "mid_batch" && c[s].batch.size() < 2) {
                    c[s].point = "before_commit";
                }
                if (!attempt(std::move(c)))
                    ++d;
                else
                    any = true;
            }
        }
        return any;
    }

    // Takes crashes away, and plain first deliveries for copies.
    bool simplify() {
        bool any = false;
        for (std::size_t s = 0; s < steps().size() && runs_left_ > 0; ++s) {
            if (steps()[s].crash != crash_kind::none) {
                auto c = steps();
                c[s].crash = crash_kind::none;
                c[s].point.clear();
                any = attempt(std::move(c)) || any;
            }
            for (std::size_t d = 0; d < steps()[s].batch.size() && runs_left_ > 0; ++d) {
                if (steps()[s].batch[d].kind == copy_kind::original) continue;
                auto c = steps();
                c[s].batch[d].kind = copy_kind::original;
                any = attempt(std::move(c)) || any;
            }
        }
        return any;
    }

    shrunk run() {
        while (runs_left_ > 0) {
            bool any = drop_steps();
            any = drop_deliveries() || any;
            any = simplify() || any;
            if (!any) break;
        }
        return std::move(best_);
    }

private:
    const std::vector<step>& steps() const { return best_.steps; }

    shrunk best_;
    const failure_test& fails_;
    std::size_t runs_left_;
};

}  // namespace

shrunk shrink(std::vector<step> steps, chaos_difference difference, const failure_test& fails, std::size_t max_runs) {
    return shrinker{{std::move(steps), std::move(difference)}, fails, max_runs}.run();
}

}  // namespace idem::testing::detail
