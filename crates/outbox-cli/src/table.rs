//! The CLI's listings as plain-text tables: each column as wide as its widest cell, so a long
//! id or name never pushes the columns after it out of line. No borders, two spaces between
//! columns, no trailing spaces.

use comfy_table::{presets::NOTHING, CellAlignment, ColumnConstraint, ContentArrangement, Table};

/// How a column's cells line up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// `rows` under `header` (a name and an alignment per column), one line each, ending in a
/// newline. Cells are shown as given: escape writers' data before.
pub(crate) fn render(
    header: &[(&str, Align)],
    rows: impl IntoIterator<Item = Vec<String>>,
) -> String {
    let mut table = Table::new();
    table
        .load_style(NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.iter().map(|(name, _)| *name));
    for row in rows {
        table.add_row(row);
    }
    let last = header.len().saturating_sub(1);
    for (i, (column, (_, align))) in table.column_iter_mut().zip(header).enumerate() {
        column.set_padding((0, if i == last { 0 } else { 2 }));
        column.set_constraint(ColumnConstraint::ContentWidth);
        column.set_cell_alignment(match align {
            Align::Left => CellAlignment::Left,
            Align::Right => CellAlignment::Right,
        });
    }
    let mut out = String::new();
    for line in table.lines() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_fit_their_widest_cell_and_numbers_align_right() {
        let out = render(
            &[
                ("id", Align::Right),
                ("aggregate", Align::Left),
                ("error", Align::Left),
            ],
            [
                vec!["7".into(), "order/1".into(), "refused".into()],
                vec![
                    "1234".into(),
                    "order/a-very-long-aggregate-id-that-used-to-break-the-columns".into(),
                    "timeout".into(),
                ],
                vec!["12".into(), "x".into(), String::new()],
            ],
        );
        assert_eq!(
            out,
            "  id  aggregate                                                      error\n\
             \x20  7  order/1                                                        refused\n\
             1234  order/a-very-long-aggregate-id-that-used-to-break-the-columns  timeout\n\
             \x20 12  x\n"
        );
    }

    #[test]
    fn a_table_without_rows_is_its_header() {
        assert_eq!(
            render(&[("partition", Align::Right), ("owner", Align::Left)], []),
            "partition  owner\n"
        );
    }
}
