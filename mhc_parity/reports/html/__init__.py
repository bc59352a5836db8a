"""report.html: one self-contained page of a run (and, with a baseline, the gate's judgement of it).

page       `render_html`: the layout, style sheet and section order, and the first screen (the verdict, its
           counts, the gate's verdict, the verdict per implementation)
tables     escaping, cells, `html_table` (the page's printer of a `mhc_parity.reports.tables.Table`) and the
           table sections: sharpness, worst offenders, drift, per-case detail, environment
figures    what each figure draws (bound panels, histograms), drawn once and stored (`figure_svg`), and the
           sections around them, the Speed section with its plot among them
heatmaps   the error-ratio heatmaps, written as HTML tables
svg        every matplotlib call: the three drawings as inline SVG, imported only to draw a figure not stored yet
"""
