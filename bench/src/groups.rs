//! The paper's groups of kernel code (Table 2: a network driver, the scheduler, the slab
//! allocator, the page allocator; plus TCP), picked out of vmlinux by symbol name.
//!
//! kallsyms has no source file names, so a group is a list of name patterns (globs: `*` matches
//! any run of characters, everything else matches itself). The defaults follow the functions of
//! `kernel/sched/`, `mm/slub.c` + `mm/slab_common.c`, `mm/page_alloc.c` and `net/ipv4/tcp*.c` in
//! Linux 6.1; the user may replace them (`NAME=GLOB,GLOB,...`). The network driver is not a
//! group of vmlinux but a whole module file from `/lib/modules/*/kernel/drivers/net/`.

use thiserror::Error;

/// A named set of functions.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Group {
    pub name: String,
    pub patterns: Vec<String>,
}

/// A group definition the user wrote that cannot be read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum GroupError {
    #[error("group `{text}`: expected NAME=GLOB[,GLOB...]")]
    Syntax { text: String },
}

impl Group {
    pub fn new(name: &str, patterns: &[&str]) -> Group {
        Group {
            name: name.to_string(),
            patterns: patterns.iter().map(ToString::to_string).collect(),
        }
    }

    /// Parse `NAME=GLOB,GLOB`.
    pub fn parse(text: &str) -> Result<Group, GroupError> {
        let syntax = || GroupError::Syntax {
            text: text.to_string(),
        };
        let (name, globs) = text.split_once('=').ok_or_else(syntax)?;
        let patterns: Vec<String> = globs
            .split(',')
            .map(str::trim)
            .filter(|g| !g.is_empty())
            .map(String::from)
            .collect();
        if name.trim().is_empty() || patterns.is_empty() {
            return Err(syntax());
        }
        Ok(Group {
            name: name.trim().to_string(),
            patterns,
        })
    }

    /// Whether a function name belongs to the group. Compiler suffixes (`.cold`, `.isra.0`,
    /// `.constprop.0`, `.part.0`) are ignored.
    pub fn contains(&self, name: &str) -> bool {
        let base = name.split('.').next().unwrap_or(name);
        self.patterns.iter().any(|p| glob(p, base))
    }
}

/// `*`-only glob matching, iterative with one backtrack point (linear in practice).
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// The default groups of vmlinux functions (Linux 6.1 names).
pub fn default_groups() -> Vec<Group> {
    vec![
        Group::new(
            "scheduler",
            &[
                "schedule",
                "schedule_*",
                "__schedule",
                "__schedule_*",
                "preempt_schedule*",
                "__cond_resched*",
                "sched_*",
                "__sched_*",
                "scheduler_*",
                "*_task_fair",
                "*_task_rt",
                "*_task_dl",
                "*_task_idle",
                "*_task_stop",
                "*_fair",
                "*_rt_rq",
                "*_rt_entity",
                "*_dl_entity",
                "*_entity_load_avg",
                "update_curr*",
                "update_load_avg",
                "update_blocked_averages",
                "update_rq_clock*",
                "try_to_wake_up",
                "ttwu_*",
                "wake_up_process",
                "wake_up_new_task",
                "wake_up_q",
                "wake_q_add*",
                "resched_*",
                "load_balance",
                "rebalance_domains",
                "newidle_balance",
                "find_busiest_*",
                "select_task_rq*",
                "pick_next_task*",
                "put_prev_task*",
                "set_next_task*",
                "check_preempt*",
                "task_tick_*",
                "yield_task*",
                "enqueue_task*",
                "dequeue_task*",
                "activate_task",
                "deactivate_task",
                "set_user_nice",
                "set_cpus_allowed*",
                "__set_cpus_allowed*",
                "migrate_task*",
                "move_queued_task",
                "do_sched_yield",
                "yield",
                "yield_to",
                "io_schedule*",
                "cpuacct_*",
                "psi_*",
                "account_*_time",
                "idle_cpu",
                "available_idle_cpu",
                "place_entity",
                "reweight_*",
                "set_load_weight",
                "init_cfs_*",
                "init_rt_*",
                "init_dl_*",
                "update_cfs_*",
                "update_dl_*",
                "update_rt_*",
                "dl_task_timer",
                "sched_rt_*",
                "dl_*_bw*",
            ],
        ),
        Group::new(
            "slab allocator",
            &[
                "kmem_cache_*",
                "__kmem_cache_*",
                "kmalloc*",
                "__kmalloc*",
                "kfree*",
                "__kfree*",
                "ksize",
                "__ksize",
                "krealloc*",
                "kmemdup*",
                "slab_*",
                "__slab_*",
                "___slab_alloc",
                "slub_*",
                "new_slab",
                "allocate_slab",
                "shuffle_freelist",
                "discard_slab",
                "free_slab",
                "__free_slab",
                "deactivate_slab",
                "get_partial*",
                "get_any_partial",
                "put_cpu_partial",
                "__unfreeze_partials",
                "unfreeze_partials*",
                "flush_cpu_slab",
                "flush_all*",
                "flush_slab",
                "__flush_cpu_slab",
                "init_kmem_cache_*",
                "calculate_sizes",
                "calculate_order",
                "create_cache",
                "create_kmalloc_*",
                "new_kmalloc_cache",
                "setup_object",
                "check_slab",
                "check_object",
                "free_debug_processing",
                "alloc_debug_processing",
                "__check_heap_object",
                "__kmem_obj_info",
                "kmem_obj_info",
                "cache_from_obj",
                "build_detached_freelist",
                "__do_kmalloc_node",
                "kmalloc_slab",
                "kmalloc_size_roundup",
                "memcg_slab_*",
            ],
        ),
        Group::new(
            "page allocator",
            &[
                "__alloc_pages*",
                "alloc_pages*",
                "__free_pages*",
                "free_pages*",
                "__free_one_page",
                "free_one_page",
                "free_pcppages_bulk",
                "free_unref_page*",
                "free_the_page",
                "__get_free_pages",
                "get_zeroed_page",
                "get_page_from_freelist",
                "rmqueue*",
                "__rmqueue*",
                "prep_new_page",
                "post_alloc_hook",
                "prep_compound_page",
                "*_pageblock_*",
                "*pageblock_migratetype*",
                "move_freepages*",
                "steal_suitable_fallback",
                "find_suitable_fallback",
                "unreserve_highatomic_*",
                "reserve_highatomic_*",
                "zone_watermark_*",
                "__zone_watermark_*",
                "zone_pcp_*",
                "drain_pages*",
                "drain_local_pages",
                "drain_all_pages",
                "__drain_all_pages",
                "drain_zone_pages",
                "should_reclaim_retry",
                "should_compact_retry",
                "__alloc_pages_slowpath",
                "__perform_reclaim",
                "wake_all_kswapds",
                "gfp_pfmemalloc_allowed",
                "build_all_zonelists*",
                "build_zonelists*",
                "split_page",
                "__isolate_free_page",
                "__putback_isolated_page",
                "alloc_contig_*",
                "free_contig_range",
                "nr_free_*",
                "si_meminfo*",
                "show_free_areas",
                "setup_per_zone_*",
                "calculate_totalreserve_pages",
                "page_frag_*",
                "__page_frag_*",
                "make_alloc_exact",
                "alloc_pages_exact*",
                "free_pages_exact",
                "page_alloc_*",
                "__build_all_zonelists",
                "adjust_managed_page_count",
                "free_reserved_area",
                "free_tail_page_prepare",
                "bad_page",
                "check_new_page*",
                "free_page_is_bad*",
                "__free_pages_ok",
                "free_pages_prepare",
                "__free_pages_core",
                "expand",
                "del_page_from_free_list",
                "add_to_free_list*",
            ],
        ),
        Group::new(
            "TCP",
            &[
                "tcp_*",
                "__tcp_*",
                "tcp4_*",
                "tcp6_*",
                "tcpv4_*",
                "tcpv6_*",
                "bictcp_*",
                "cubictcp_*",
                "do_tcp_*",
            ],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_prefixes_suffixes_and_middles() {
        assert!(glob("tcp_*", "tcp_sendmsg"));
        assert!(!glob("tcp_*", "udp_sendmsg"));
        assert!(glob("*_task_fair", "enqueue_task_fair"));
        assert!(glob("*pageblock_migratetype*", "set_pageblock_migratetype"));
        assert!(glob("a*b*c", "axxbyyc"));
        assert!(!glob("a*b*c", "axxbyy"));
        assert!(glob("schedule", "schedule"));
        assert!(!glob("schedule", "schedule_timeout"));
        assert!(glob("*", ""));
    }

    #[test]
    fn compiler_suffixes_are_ignored() {
        let g = Group::new("t", &["tcp_*"]);
        assert!(g.contains("tcp_ack.cold"));
        assert!(g.contains("tcp_v4_rcv.isra.0"));
    }

    #[test]
    fn default_groups_put_known_functions_where_they_belong() {
        let groups = default_groups();
        let of = |f: &str| {
            groups
                .iter()
                .filter(|g| g.contains(f))
                .map(|g| g.name.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(of("__schedule"), ["scheduler"]);
        assert_eq!(of("enqueue_task_fair"), ["scheduler"]);
        assert_eq!(of("kmem_cache_alloc"), ["slab allocator"]);
        assert_eq!(of("___slab_alloc"), ["slab allocator"]);
        assert_eq!(of("get_page_from_freelist"), ["page allocator"]);
        assert_eq!(of("__alloc_pages"), ["page allocator"]);
        assert_eq!(of("tcp_sync_mss"), ["TCP"]);
        assert!(of("ext4_readdir").is_empty());
    }

    #[test]
    fn user_groups_parse_and_reject_bad_text() {
        let g = Group::parse("ext4=ext4_*, jbd2_*").unwrap();
        assert_eq!(g.name, "ext4");
        assert_eq!(g.patterns, ["ext4_*", "jbd2_*"]);
        assert!(Group::parse("nothing").is_err());
        assert!(Group::parse("=x").is_err());
        assert!(Group::parse("x=").is_err());
    }
}
