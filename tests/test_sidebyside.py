"""experiments.sidebyside: the schedule and the paired ratio every benchmark reports. The schedule must put each
variant in each position once per n items (so a drift is shared) and follow the item's index (a resumed run keeps
it); a paired ratio reads only items both sides measured."""
import statistics

from experiments import sidebyside


def _balanced(order, n: int) -> bool:
    """Whether `order` runs every variant once per item and in each position once over n items."""
    orders = [order(i, n) for i in range(n)]
    return all(sorted(o) == list(range(n)) for o in orders) and all(
        sorted(o[position] for o in orders) == list(range(n)) for position in range(n))


def test_the_rotation_puts_each_variant_in_each_position_once_per_round_of_items():
    assert all(_balanced(sidebyside.order, n) for n in (1, 2, 3, 5))
    assert not _balanced(lambda i, n: list(range(n)), 3)  # control: a schedule that never rotates
    assert sidebyside.order(7, 3) == sidebyside.order(1, 3)  # it follows the index: a resumed run keeps it
    assert sidebyside.rotated(1, ["ar", "slem", "tli"]) == ["slem", "tli", "ar"]


def test_paired_ratios_read_only_the_items_both_sides_measured():
    speed = {"p0": 2.0, "p1": 3.0, "p2": 100.0}
    base = {"p0": 1.0, "p1": 1.0, "p3": 1.0}
    assert sidebyside.paired_ratios(speed, base) == [2.0, 3.0]
    assert sidebyside.median_ratio(speed, base) == 2.5
    assert sidebyside.median_ratio(speed, {}) is None
    # one disturbed item moves the pooled ratio, not the median
    slow = dict(base, p1=10.0)
    ratios = sidebyside.paired_ratios(speed, slow)
    assert statistics.median(ratios) == sidebyside.median_ratio(speed, slow) and min(ratios) == 0.3
    q1, median, q3 = sidebyside.spread([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (q1, median, q3) == (1.5, 3.0, 4.5) and sidebyside.spread([2.0]) == (2.0, 2.0, 2.0)
